//! KV-cache bytes per token of a model, from its shape.
//!
//! For standard (multi-head or grouped-query) attention, each layer keeps a key and a value
//! vector per KV head: `2 × layers × kv_heads × head_dim × dtype bytes` per token. For
//! multi-head latent attention (DeepSeek-V2/V3), each layer keeps one compressed latent and
//! the decoupled RoPE key: `layers × (kv_lora_rank + qk_rope_head_dim) × dtype bytes`.

use serde::{Deserialize, Serialize};

/// Element type of the cached keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    Bf16,
    F16,
    Fp8,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::Fp8 => 1,
        }
    }

    pub fn parse(s: &str) -> Option<Dtype> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Dtype::F32,
            "bf16" | "bfloat16" => Dtype::Bf16,
            "f16" | "fp16" | "float16" => Dtype::F16,
            "fp8" | "f8" | "e4m3" | "e5m2" => Dtype::Fp8,
            _ => return None,
        })
    }
}

/// Multi-head latent attention: what each layer caches per token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mla {
    pub kv_lora_rank: u64,
    pub qk_rope_head_dim: u64,
}

/// A model's KV-cache shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    pub name: String,
    pub layers: u64,
    /// KV heads (grouped-query attention shares one among several query heads).
    pub kv_heads: u64,
    pub head_dim: u64,
    pub dtype: Dtype,
    /// Set for MLA models: then `kv_heads` and `head_dim` do not count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<Mla>,
}

impl ModelShape {
    /// Bytes of KV cache one token takes, all layers together.
    pub fn kv_bytes_per_token(&self) -> u64 {
        // Saturating: a custom shape read from a request may be absurd; it then plans
        // absurd sizes instead of overflowing.
        let dtype = self.dtype.bytes();
        match self.mla {
            Some(m) => self
                .layers
                .saturating_mul(m.kv_lora_rank.saturating_add(m.qk_rope_head_dim))
                .saturating_mul(dtype),
            None => 2u64
                .saturating_mul(self.layers)
                .saturating_mul(self.kv_heads)
                .saturating_mul(self.head_dim)
                .saturating_mul(dtype),
        }
    }

    /// Bytes of one block of `tokens` tokens.
    pub fn block_bytes(&self, tokens: u64) -> u64 {
        self.kv_bytes_per_token().saturating_mul(tokens)
    }

    /// A custom shape from `layers=80,kv_heads=8,head_dim=128,dtype=bf16` (or, for MLA,
    /// `layers=61,kv_lora_rank=512,qk_rope_head_dim=64,dtype=bf16`).
    pub fn parse_custom(s: &str) -> Result<ModelShape, String> {
        let mut layers = None;
        let (mut kv_heads, mut head_dim) = (None, None);
        let (mut rank, mut rope) = (None, None);
        let mut dtype = Dtype::Bf16;
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not key=value"))?;
            let num = || {
                v.parse::<u64>()
                    .ok()
                    .filter(|n| (1..=1 << 20).contains(n))
                    .ok_or_else(|| format!("{k}: {v:?} is not a number within 1..=1048576"))
            };
            match k {
                "layers" => layers = Some(num()?),
                "kv_heads" => kv_heads = Some(num()?),
                "head_dim" => head_dim = Some(num()?),
                "kv_lora_rank" => rank = Some(num()?),
                "qk_rope_head_dim" => rope = Some(num()?),
                "dtype" => dtype = Dtype::parse(v).ok_or_else(|| format!("unknown dtype {v:?}"))?,
                _ => return Err(format!("unknown key {k:?}")),
            }
        }
        let layers = layers.ok_or("layers is required")?;
        let mla = match (rank, rope) {
            (Some(kv_lora_rank), Some(qk_rope_head_dim)) => Some(Mla {
                kv_lora_rank,
                qk_rope_head_dim,
            }),
            (None, None) => None,
            _ => return Err("MLA needs both kv_lora_rank and qk_rope_head_dim".into()),
        };
        if mla.is_none() && (kv_heads.is_none() || head_dim.is_none()) {
            return Err(
                "kv_heads and head_dim are required (or kv_lora_rank and qk_rope_head_dim)".into(),
            );
        }
        Ok(ModelShape {
            name: "custom".into(),
            layers,
            kv_heads: kv_heads.unwrap_or(0),
            head_dim: head_dim.unwrap_or(0),
            dtype,
            mla,
        })
    }
}

fn gqa(name: &str, layers: u64, kv_heads: u64, head_dim: u64) -> ModelShape {
    ModelShape {
        name: name.into(),
        layers,
        kv_heads,
        head_dim,
        dtype: Dtype::Bf16,
        mla: None,
    }
}

fn mla(name: &str, layers: u64, kv_lora_rank: u64, qk_rope_head_dim: u64) -> ModelShape {
    ModelShape {
        name: name.into(),
        layers,
        kv_heads: 0,
        head_dim: 0,
        dtype: Dtype::Bf16,
        mla: Some(Mla {
            kv_lora_rank,
            qk_rope_head_dim,
        }),
    }
}

/// Shapes of public model families, from their published `config.json` (bf16 KV cache):
/// `num_hidden_layers`, `num_key_value_heads`, `head_dim` (or hidden size / attention
/// heads), and for MLA `kv_lora_rank` and `qk_rope_head_dim`.
pub fn presets() -> Vec<ModelShape> {
    vec![
        gqa("llama-3.1-8b", 32, 8, 128),
        gqa("llama-3.1-70b", 80, 8, 128),
        gqa("llama-3.1-405b", 126, 8, 128),
        gqa("qwen2.5-7b", 28, 4, 128),
        gqa("qwen2.5-72b", 80, 8, 128),
        gqa("mistral-7b", 32, 8, 128),
        mla("deepseek-v3", 61, 512, 64),
        mla("deepseek-v2-lite", 27, 512, 64),
    ]
}

/// A preset by name, or a custom shape (`layers=...,...`).
pub fn shape(name_or_custom: &str) -> Result<ModelShape, String> {
    if name_or_custom.contains('=') {
        return ModelShape::parse_custom(name_or_custom);
    }
    presets()
        .into_iter()
        .find(|m| m.name == name_or_custom)
        .ok_or_else(|| {
            let names: Vec<String> = presets().into_iter().map(|m| m.name).collect();
            format!(
                "unknown model {name_or_custom:?}: one of {} or layers=..,kv_heads=..,head_dim=..,dtype=..",
                names.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_token_by_hand() {
        // 2 (K and V) × 80 layers × 8 KV heads × 128 × 2 bytes = 327,680 = 320 KiB.
        assert_eq!(
            shape("llama-3.1-70b").unwrap().kv_bytes_per_token(),
            320 << 10
        );
        // 2 × 32 × 8 × 128 × 2 = 131,072 = 128 KiB; a 512-token block is 64 MiB.
        let l8 = shape("llama-3.1-8b").unwrap();
        assert_eq!(l8.kv_bytes_per_token(), 128 << 10);
        assert_eq!(l8.block_bytes(512), 64 << 20);
        // 2 × 28 × 4 × 128 × 2 = 57,344 = 56 KiB.
        assert_eq!(shape("qwen2.5-7b").unwrap().kv_bytes_per_token(), 56 << 10);
        // MLA: 61 × (512 + 64) × 2 = 70,272.
        assert_eq!(shape("deepseek-v3").unwrap().kv_bytes_per_token(), 70_272);
        // fp8 halves it.
        let fp8 = ModelShape::parse_custom("layers=80,kv_heads=8,head_dim=128,dtype=fp8").unwrap();
        assert_eq!(fp8.kv_bytes_per_token(), 160 << 10);
        let m = ModelShape::parse_custom("layers=61,kv_lora_rank=512,qk_rope_head_dim=64").unwrap();
        assert_eq!(m.kv_bytes_per_token(), 70_272);
    }

    #[test]
    fn bad_shapes_are_refused_with_a_reason() {
        for bad in [
            "layers=0,kv_heads=8,head_dim=128",
            "kv_heads=8,head_dim=128",
            "layers=8,kv_heads=8",
            "layers=8,kv_heads=8,head_dim=128,dtype=int3",
            "layers=8,kv_lora_rank=512",
            "layers=8,kv_heads=x,head_dim=1",
            "layers",
            "layers=8,colour=blue",
        ] {
            assert!(ModelShape::parse_custom(bad).is_err(), "{bad}");
        }
        assert!(shape("gpt-9").unwrap_err().contains("llama-3.1-70b"));
    }
}
