//! `ctxpod plan` and `POST /v1/plan`: the planner (`ctxpod_plan::planner`) from the command
//! line or the dashboard, from the same arguments ([`PlanArgs`], a JSON body on the API with
//! the same names and defaults). Reuse comes from a trace (its exact curve, its request rate
//! and prompt lengths; CLI only), the pod's live miss-ratio curve, or a stated sharing ratio;
//! the drive from a firmware-sim profile (`tlc`, `qlc`, or a TOML file on the CLI).

use ctxpod_plan::planner::{self, Drive, NodeShape, PlanInput, Reuse};
use ctxpod_wire::types::MrcResponse;

#[derive(clap::Args, Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlanArgs {
    /// Model: a preset (llama-3.1-70b, deepseek-v3, ...) or
    /// `layers=..,kv_heads=..,head_dim=..,dtype=..`.
    #[arg(long, default_value = "llama-3.1-70b")]
    pub model: String,
    /// Parameters used per token, in billions (active ones for MoE); default: the preset's.
    #[arg(long)]
    pub params_b: Option<f64>,
    #[arg(long, default_value_t = 512)]
    pub tokens_per_block: u64,
    /// Requests per second to plan for; default: the trace's rate.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Mean prompt tokens per request; default: the trace's.
    #[arg(long)]
    pub input_tokens: Option<f64>,
    /// Reuse from a trace (Mooncake JSONL): its exact hit-ratio curve.
    #[arg(long, conflicts_with_all = ["sharing", "live"])]
    #[serde(skip)]
    pub trace: Option<std::path::PathBuf>,
    /// Reuse from the pod's live miss-ratio curve (`GET /v1/mrc?scope=pod` of --addr): the
    /// rate defaults to the one it was measured at; --input-tokens is needed.
    #[arg(long, conflicts_with = "sharing")]
    pub live: bool,
    /// Reuse as a stated share of prompt blocks found in the tier (needs --retention-s).
    #[arg(long)]
    pub sharing: Option<f64>,
    /// Hit ratio to plan for (blocks), with a trace.
    #[arg(long, default_value_t = 0.3)]
    pub target_hit_ratio: f64,
    /// Seconds a block must stay at least.
    #[arg(long, default_value_t = 0.0)]
    pub retention_s: f64,
    /// Drive: a firmware-sim profile (`tlc`, `qlc`) or a profile TOML file.
    #[arg(long, default_value = "qlc")]
    pub drive: String,
    #[arg(long, default_value_t = 8)]
    pub drives: u32,
    /// A fast tier's drive (a firmware-sim profile: `slc`, ...): plan nodes of two tiers,
    /// this in front of --drive (sized from the reuse curve; docs/PLANNING.md).
    #[arg(long)]
    pub fast_drive: Option<String>,
    /// Fast-tier drives per node.
    #[arg(long, default_value_t = 2)]
    pub fast_drives: u32,
    /// Share of the planned hits the fast tier should serve.
    #[arg(long, default_value_t = 0.5)]
    pub fast_hit_share: f64,
    #[arg(long, default_value_t = 1)]
    pub nics: u32,
    #[arg(long, default_value_t = 400.0)]
    pub nic_gbps: f64,
    /// Share of drive capacity for blocks.
    #[arg(long, default_value_t = 0.9)]
    pub usable: f64,
    /// Device bytes per block byte (1.2 to 1.25 measured by `ctxpod replay`).
    #[arg(long, default_value_t = 1.25)]
    pub write_amplification: f64,
    #[arg(long, default_value_t = 1)]
    pub replication: u32,
    /// A GPU's dense bf16 TFLOP/s (989: H100 SXM) and the share prefill reaches.
    #[arg(long, default_value_t = 989.0)]
    pub gpu_tflops: f64,
    #[arg(long, default_value_t = 0.5)]
    pub gpu_mfu: f64,
    /// Print the inputs and the plan as JSON.
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

impl Default for PlanArgs {
    /// The command line's defaults (so the API's are the same).
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            a: PlanArgs,
        }
        <Wrap as clap::Parser>::parse_from(["plan"]).a
    }
}

/// The range of a numeric argument, the same for `ctxpod plan` and `POST /v1/plan`:
/// `api/openapi.json`'s `PlanRequest` states these (`minimum`, `exclusiveMinimum`,
/// `maximum`), and a unit test holds the two together. The maxima are generous for real
/// hardware and keep the plan's arithmetic finite.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bound {
    /// The argument's API name (snake case; on the command line `--kebab-case`).
    pub name: &'static str,
    pub min: f64,
    /// The value must be above `min` (`min` itself is refused).
    pub above_min: bool,
    pub max: f64,
    /// A whole number (the spec's `integer`).
    pub integer: bool,
}

impl Bound {
    const fn real(name: &'static str, min: f64, above_min: bool, max: f64) -> Self {
        Bound {
            name,
            min,
            above_min,
            max,
            integer: false,
        }
    }

    const fn whole(name: &'static str, min: u32, max: u32) -> Self {
        Bound {
            name,
            min: min as f64,
            above_min: false,
            max: max as f64,
            integer: true,
        }
    }

    /// Whether `v` is within the range (a finite number).
    pub fn admits(&self, v: f64) -> bool {
        let low = if self.above_min {
            v > self.min
        } else {
            v >= self.min
        };
        v.is_finite() && low && v <= self.max
    }

    /// The range in words, for the refusal.
    fn describe(&self) -> String {
        let low = if self.above_min { "above" } else { "at least" };
        let kind = if self.integer {
            "a whole number"
        } else {
            "a number"
        };
        format!("{kind} {low} {} and at most {}", self.min, self.max)
    }
}

/// Every numeric argument's range (see [`Bound`]).
pub const BOUNDS: [Bound; 17] = [
    Bound::real("params_b", 0.0, true, 1e6),
    Bound::whole("tokens_per_block", 1, 1 << 20),
    Bound::real("rate", 0.0, true, 1e9),
    Bound::real("input_tokens", 0.0, true, 1e9),
    Bound::real("sharing", 0.0, false, 1.0),
    Bound::real("target_hit_ratio", 0.0, false, 1.0),
    Bound::real("retention_s", 0.0, false, 1e9),
    Bound::whole("drives", 1, 4096),
    Bound::whole("fast_drives", 1, 4096),
    Bound::real("fast_hit_share", 0.0, true, 1.0),
    Bound::whole("nics", 1, 4096),
    Bound::real("nic_gbps", 0.0, true, 1e6),
    Bound::real("usable", 0.0, true, 1.0),
    Bound::real("write_amplification", 0.0, true, 100.0),
    Bound::whole("replication", 1, ctxpod_wire::REPLICATION_MAX),
    Bound::real("gpu_tflops", 0.0, true, 1e6),
    Bound::real("gpu_mfu", 0.0, true, 1.0),
];

/// The numeric arguments of `a` by name (`None`: not given).
fn numbers(a: &PlanArgs) -> [(&'static str, Option<f64>); 17] {
    [
        ("params_b", a.params_b),
        ("tokens_per_block", Some(a.tokens_per_block as f64)),
        ("rate", a.rate),
        ("input_tokens", a.input_tokens),
        ("sharing", a.sharing),
        ("target_hit_ratio", Some(a.target_hit_ratio)),
        ("retention_s", Some(a.retention_s)),
        ("drives", Some(a.drives as f64)),
        ("fast_drives", Some(a.fast_drives as f64)),
        ("fast_hit_share", Some(a.fast_hit_share)),
        ("nics", Some(a.nics as f64)),
        ("nic_gbps", Some(a.nic_gbps)),
        ("usable", Some(a.usable)),
        ("write_amplification", Some(a.write_amplification)),
        ("replication", Some(a.replication as f64)),
        ("gpu_tflops", Some(a.gpu_tflops)),
        ("gpu_mfu", Some(a.gpu_mfu)),
    ]
}

/// Every numeric argument within its [`Bound`]; the first that is not, named.
pub fn check_ranges(a: &PlanArgs) -> anyhow::Result<()> {
    for (name, v) in numbers(a) {
        let (Some(v), Some(b)) = (v, BOUNDS.iter().find(|b| b.name == name)) else {
            continue;
        };
        anyhow::ensure!(b.admits(v), "{name} must be {}; got {v}", b.describe());
    }
    Ok(())
}

/// The drive profiles the API accepts by name (a profile file is for the CLI only).
pub const API_DRIVES: [&str; 6] = ["tlc", "qlc", "slc", "tlc-noplp", "qlc-noplp", "slc-noplp"];

/// Parameters per token of the presets (billions; active parameters for MoE), from the
/// models' cards.
pub fn preset_params_b(model: &str) -> Option<f64> {
    Some(match model {
        "llama-3.1-8b" => 8.0,
        "llama-3.1-70b" => 70.6,
        "llama-3.1-405b" => 405.9,
        "qwen2.5-7b" => 7.6,
        "qwen2.5-72b" => 72.7,
        "mistral-7b" => 7.2,
        "deepseek-v3" => 37.0,
        "deepseek-v2-lite" => 2.4,
        _ => return None,
    })
}

/// A drive from a firmware-sim profile: reads at the host link, writes at what its dies
/// program at once (dies × program unit / program time) or the host link.
pub fn drive_of(spec: &str) -> anyhow::Result<Drive> {
    let p = ctxpod_firmware_sim::profile::Profile::load(spec).map_err(|e| anyhow::anyhow!(e))?;
    let dies = (p.channels * p.dies_per_channel) as f64;
    let program = dies * p.page_bytes as f64 / (p.program.p50_us * 1e-6);
    Ok(Drive {
        name: p.name.clone(),
        capacity_bytes: p.rated_capacity_bytes,
        read_bytes_per_s: p.host_bytes_per_s,
        write_bytes_per_s: program.min(p.host_bytes_per_s),
        rated_dwpd: p.rated_dwpd,
        warranty_years: p.warranty_years,
    })
}

/// The planner's input from the arguments, and the pod's live curve when `a.live`.
pub fn input_of(a: &PlanArgs, live: Option<&MrcResponse>) -> anyhow::Result<PlanInput> {
    check_ranges(a)?;
    let model = ctxpod_plan::model::shape(&a.model).map_err(|e| anyhow::anyhow!(e))?;
    let params = a
        .params_b
        .or_else(|| preset_params_b(&a.model))
        .ok_or_else(|| anyhow::anyhow!("--params-b is needed for a custom model"))?;
    anyhow::ensure!(
        [a.trace.is_some(), a.live, a.sharing.is_some()]
            .iter()
            .filter(|&&x| x)
            .count()
            <= 1,
        "give one reuse: --trace FILE, --live or --sharing RATIO"
    );
    let (reuse, rate, input) = match (&a.trace, a.sharing) {
        (None, None) if a.live => live_reuse(a, live)?,
        (Some(t), _) => trace_reuse(a, t)?,
        (None, Some(ratio)) => (
            Reuse::Sharing { ratio },
            a.rate
                .ok_or_else(|| anyhow::anyhow!("--rate is needed without a trace"))?,
            a.input_tokens
                .ok_or_else(|| anyhow::anyhow!("--input-tokens is needed without a trace"))?,
        ),
        (None, None) => {
            anyhow::bail!("give the reuse: --trace FILE, --live or --sharing RATIO")
        }
    };
    Ok(PlanInput {
        model,
        active_params_b: params,
        tokens_per_block: a.tokens_per_block,
        requests_per_s: rate,
        mean_input_tokens: input,
        reuse,
        target_hit_ratio: a.target_hit_ratio,
        retention_s: a.retention_s,
        node: NodeShape {
            drives: a.drives,
            drive: drive_of(&a.drive)?,
            nics: a.nics,
            nic_gbit_per_s: a.nic_gbps,
            usable_fraction: a.usable,
        },
        write_amplification: a.write_amplification,
        replication: a.replication,
        gpu_flops: a.gpu_tflops * 1e12,
        gpu_mfu: a.gpu_mfu,
        fast: match &a.fast_drive {
            Some(d) => Some(ctxpod_plan::tiers::FastTier {
                drives: a.fast_drives,
                drive: drive_of(d)?,
                hit_share: a.fast_hit_share,
            }),
            None => None,
        },
    })
}

/// The reuse, request rate and mean prompt tokens of the pod's live miss-ratio curve
/// (`--live`): the rate defaults to the one the curve was measured at.
fn live_reuse(a: &PlanArgs, live: Option<&MrcResponse>) -> anyhow::Result<(Reuse, f64, f64)> {
    let c = live.ok_or_else(|| anyhow::anyhow!("the live curve was not read"))?;
    let input = a
        .input_tokens
        .ok_or_else(|| anyhow::anyhow!("--input-tokens is needed with --live"))?;
    anyhow::ensure!(
        c.references > 0 && c.references_per_s > 0.0,
        "the live curve has no references yet: nothing to plan from"
    );
    anyhow::ensure!(
        input > 0.0 && a.tokens_per_block > 0,
        "--input-tokens and --tokens-per-block must be positive"
    );
    // Each request references each of its blocks once (a hit read or a miss
    // written), so the curve was measured at references/s ÷ blocks a request.
    let blocks = (input / a.tokens_per_block as f64).ceil().max(1.0);
    let measured = c.references_per_s / blocks;
    let points = c
        .points
        .iter()
        .map(|p| (p.capacity_blocks as f64, p.hit_ratio))
        .collect();
    Ok((
        Reuse::Curve {
            points,
            at_requests_per_s: measured,
        },
        a.rate.unwrap_or(measured),
        input,
    ))
}

/// The reuse, request rate and mean prompt tokens of trace `t` (`--trace`): its exact
/// hit-ratio curve, its rate and its prompts unless the arguments say otherwise.
fn trace_reuse(a: &PlanArgs, t: &std::path::Path) -> anyhow::Result<(Reuse, f64, f64)> {
    let reqs =
        ctxpod_plan::trace::read_file(t).map_err(|e| anyhow::anyhow!("{}: {e}", t.display()))?;
    let s = ctxpod_plan::trace::summary(&reqs);
    anyhow::ensure!(
        s.requests > 1 && s.span_ms > 0,
        "the trace is too short to plan from"
    );
    let trace_rate = s.requests as f64 / (s.span_ms as f64 / 1000.0);
    let caps: Vec<u64> = (0..64)
        .map(|i| (100.0 * (s.unique_blocks as f64 / 50.0).powf(i as f64 / 63.0)) as u64)
        .collect();
    let points = ctxpod_plan::mrc::exact_curve(&reqs, &caps)
        .into_iter()
        .map(|(c, h)| (c as f64, h))
        .collect();
    Ok((
        Reuse::Curve {
            points,
            at_requests_per_s: trace_rate,
        },
        a.rate.unwrap_or(trace_rate),
        a.input_tokens
            .unwrap_or(s.input_tokens as f64 / s.requests as f64),
    ))
}

/// The plan for `a` as `ctxpod plan --json` prints it and `POST /v1/plan` answers it:
/// `{"input": PlanInput, "plan": Plan}`.
pub fn plan_json(a: &PlanArgs, live: Option<&MrcResponse>) -> anyhow::Result<serde_json::Value> {
    let input = input_of(a, live)?;
    let p = planner::plan(&input).map_err(|e| anyhow::anyhow!(e))?;
    Ok(serde_json::json!({"input": input, "plan": p}))
}

pub fn run(a: &PlanArgs, live: Option<&MrcResponse>) -> anyhow::Result<planner::Plan> {
    let input = input_of(a, live)?;
    let p = planner::plan(&input).map_err(|e| anyhow::anyhow!(e))?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"input": input, "plan": p}))?
        );
    } else {
        let gb = |b: f64| b / 1e9;
        println!(
            "{}: {} KiB of KV per token, {:.1} MiB per {}-token block, {:.0} blocks a request\n\
             at {:.2} requests/s, hit ratio {:.3}:\n\
             capacity     {:.0} blocks, {:.2} TB ({} cop{})\n\
             read         {:.2} GB/s\n\
             written      {:.2} GB/s (block bytes, all copies)\n\
             nodes        {} ({} × {} TB {}, {} × {} Gb/s): bound by {} \
             (capacity {:.2}, read {:.2}, write {:.2})\n\
             drive wear   {:.3} drive writes per day: rated writes last {:.1} years\n\
             prefill saved {:.0} tokens/s = {:.1} GPUs ({} TFLOP/s at {:.0} % MFU)",
            a.model,
            p.kv_bytes_per_token / 1024,
            p.block_bytes as f64 / 1048576.0,
            input.tokens_per_block,
            p.blocks_per_request,
            input.requests_per_s,
            p.hit_ratio,
            p.capacity_blocks,
            p.capacity_bytes / 1e12,
            input.replication,
            if input.replication == 1 { "y" } else { "ies" },
            gb(p.read_bytes_per_s),
            gb(p.write_bytes_per_s),
            p.nodes,
            input.node.drives,
            input.node.drive.capacity_bytes as f64 / 1e12,
            input.node.drive.name,
            input.node.nics,
            input.node.nic_gbit_per_s,
            p.bound_by,
            p.nodes_for_capacity,
            p.nodes_for_read,
            p.nodes_for_write,
            p.dwpd,
            p.drive_lifetime_years,
            p.prefill_tokens_saved_per_s,
            p.gpus_saved,
            a.gpu_tflops,
            a.gpu_mfu * 100.0,
        );
        if let (Some(t), Some(f)) = (&p.tiers, &input.fast) {
            print_tiers(t, f);
        }
        for n in &p.notes {
            println!("note: {n}");
        }
    }
    Ok(p)
}

/// The two tiers' lines of `ctxpod plan`.
fn print_tiers(t: &ctxpod_plan::tiers::TierPlan, f: &ctxpod_plan::tiers::FastTier) {
    println!(
        "fast tier    {:.0} blocks, {:.2} TB on {} × {} TB {} a node: hit ratio {:.3} \
         (nodes for its capacity {:.2}, for the writes it takes first {:.2})\n\
         dense tier   {:.2} TB: hit ratio {:.3} (nodes for its capacity {:.2})\n\
         tier wear    fast {:.2} drive writes per day: rated writes last {:.1} years; \
         dense {:.3}: {:.1} years",
        t.fast_capacity_blocks,
        t.fast_capacity_bytes / 1e12,
        f.drives,
        f.drive.capacity_bytes as f64 / 1e12,
        f.drive.name,
        t.fast_hit_ratio,
        t.nodes_for_fast_capacity,
        t.nodes_for_fast_write,
        t.dense_capacity_bytes / 1e12,
        t.dense_hit_ratio,
        t.nodes_for_dense_capacity,
        t.fast_dwpd,
        t.fast_lifetime_years,
        t.dense_dwpd,
        t.dense_lifetime_years,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `PlanRequest` in api/openapi.json.
    fn spec_plan_request() -> serde_json::Value {
        let doc: serde_json::Value =
            serde_json::from_str(ctxpod_wire::OPENAPI_JSON).expect("openapi.json parses");
        doc["components"]["schemas"]["PlanRequest"].clone()
    }

    /// The spec states exactly these ranges: every numeric property has its bound, with
    /// the same minimum (exclusive or not), maximum and type.
    #[test]
    fn bounds_are_the_specs() {
        let spec = spec_plan_request();
        let props = spec["properties"].as_object().expect("properties");
        let numeric: Vec<&str> = props
            .iter()
            .filter(|(_, p)| matches!(p["type"].as_str(), Some("number" | "integer")))
            .map(|(n, _)| n.as_str())
            .collect();
        let mut names: Vec<&str> = BOUNDS.iter().map(|b| b.name).collect();
        let mut want = numeric.clone();
        names.sort();
        want.sort();
        assert_eq!(names, want, "BOUNDS names the spec's numeric properties");
        for b in BOUNDS {
            let p = &props[b.name];
            let ty = if b.integer { "integer" } else { "number" };
            assert_eq!(p["type"], ty, "{}: type", b.name);
            assert_eq!(p["minimum"].as_f64(), Some(b.min), "{}: minimum", b.name);
            assert_eq!(
                p["exclusiveMinimum"].as_bool().unwrap_or(false),
                b.above_min,
                "{}: exclusiveMinimum",
                b.name
            );
            assert_eq!(p["maximum"].as_f64(), Some(b.max), "{}: maximum", b.name);
            assert!(
                p.get("exclusiveMaximum").is_none(),
                "{}: maxima are inclusive",
                b.name
            );
            // A default the spec states is within the range.
            if let Some(d) = p.get("default") {
                assert!(b.admits(d.as_f64().expect("number")), "{}: default", b.name);
            }
        }
    }

    /// Every bound is checked, and the CLI's defaults are within them.
    #[test]
    fn every_number_is_checked() {
        let a = PlanArgs::default();
        let mut checked: Vec<&str> = numbers(&a).iter().map(|(n, _)| *n).collect();
        let mut names: Vec<&str> = BOUNDS.iter().map(|b| b.name).collect();
        checked.sort();
        names.sort();
        assert_eq!(checked, names);
        check_ranges(&a).expect("the defaults are within range");
    }

    /// One argument of `a` set to `v` through the API's JSON (the same path as a request).
    fn with(name: &str, v: serde_json::Value) -> PlanArgs {
        serde_json::from_value(serde_json::json!({ name: v })).expect(name)
    }

    /// Past either end (and at an exclusive minimum) a value is refused, naming the
    /// argument; at an inclusive end it is taken.
    #[test]
    fn out_of_range_is_refused_by_name() {
        for b in BOUNDS {
            // Integers as JSON integers (a u64 field takes no 1.0).
            let json = |x: f64| {
                if b.integer {
                    serde_json::json!(x as u64)
                } else {
                    serde_json::json!(x)
                }
            };
            let (above, below) = if b.integer {
                (b.max + 1.0, b.min - 1.0)
            } else {
                (b.max * 1.5, b.min - 0.5)
            };
            let mut bad = vec![above, below];
            if b.above_min {
                bad.push(b.min);
            }
            for v in bad {
                let a = with(b.name, json(v));
                let e = check_ranges(&a).expect_err(b.name).to_string();
                assert!(e.starts_with(&format!("{} must be", b.name)), "{e}");
                let e = input_of(&a, None).expect_err(b.name).to_string();
                assert!(e.starts_with(&format!("{} must be", b.name)), "{e}");
            }
            check_ranges(&with(b.name, json(b.max))).expect("the maximum is taken");
            if !b.above_min {
                check_ranges(&with(b.name, json(b.min))).expect("the minimum is taken");
            }
        }
    }

    /// A fast tier planned from the repository's Mooncake trace: half the hits from it,
    /// the rest of the capacity dense, and the fast drives worn by every write first;
    /// without a curve (a sharing ratio) or with an unknown drive, refused.
    #[test]
    fn a_fast_tier_from_a_trace() {
        let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../bench/traces/mooncake_conversation_trace.jsonl");
        let a = PlanArgs {
            trace: Some(trace),
            target_hit_ratio: 0.3,
            fast_drive: Some("slc".into()),
            ..Default::default()
        };
        let i = input_of(&a, None).expect("input");
        let p = planner::plan(&i).expect("plan");
        let t = p.tiers.expect("two tiers");
        assert!((t.fast_hit_ratio - 0.15).abs() < 1e-9 && (t.dense_hit_ratio - 0.15).abs() < 1e-9);
        assert!(t.fast_capacity_bytes > 0.0 && t.fast_capacity_bytes < p.capacity_bytes);
        assert!((t.fast_capacity_bytes + t.dense_capacity_bytes - p.capacity_bytes).abs() < 1e3);
        // The same bytes written on far fewer drive bytes: `fast` wears faster.
        assert!(t.fast_dwpd > 10.0 * t.dense_dwpd, "{t:?}");
        assert!(p.nodes as f64 >= t.nodes_for_fast_capacity.ceil());
        let sharing = PlanArgs {
            sharing: Some(0.3),
            rate: Some(5.0),
            input_tokens: Some(4000.0),
            retention_s: 600.0,
            fast_drive: Some("slc".into()),
            ..Default::default()
        };
        let e = plan_json(&sharing, None).expect_err("no curve");
        assert!(e.to_string().contains("reuse curve"), "{e}");
        let unknown = PlanArgs {
            fast_drive: Some("no-such-drive".into()),
            ..sharing
        };
        assert!(input_of(&unknown, None).is_err());
    }

    /// What issue #32 found answered 200: a GPU's MFU of 1.4e308 and 1e296 TFLOP/s.
    #[test]
    fn absurd_gpus_are_refused() {
        for (name, v) in [
            ("gpu_mfu", 1.4e308),
            ("gpu_tflops", 1e296),
            ("nic_gbps", -1.0),
        ] {
            let e = check_ranges(&with(name, serde_json::json!(v))).expect_err(name);
            assert!(e.to_string().contains(name), "{e}");
        }
        // Not a number at all (the CLI parses "NaN" and "inf").
        for v in [f64::NAN, f64::INFINITY] {
            let a = PlanArgs {
                gpu_mfu: v,
                ..Default::default()
            };
            assert!(check_ranges(&a).is_err());
        }
        // The u64 extreme of tokens_per_block.
        let e = check_ranges(&with("tokens_per_block", serde_json::json!(u64::MAX)))
            .expect_err("u64::MAX");
        assert!(e.to_string().contains("tokens_per_block"), "{e}");
    }
}
