//! Request traces in Mooncake's JSONL format: one request per line, `timestamp` (ms from the
//! trace's start), `input_length` and `output_length` (tokens), `hash_ids` (the prompt's
//! blocks of 512 tokens, each named by an integer standing for the chained hash of the block
//! and every block before it: two requests sharing a hash id share that whole prefix).

use serde::{Deserialize, Serialize};
use std::io::BufRead;

/// Tokens per block in Mooncake's traces.
pub const MOONCAKE_BLOCK_TOKENS: u64 = 512;
/// Longest line read (a request of 100,000 blocks is about 1 MB of JSON).
const LINE_BYTES_MAX: usize = 4 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Milliseconds from the start of the trace.
    pub timestamp: u64,
    pub input_length: u64,
    pub output_length: u64,
    pub hash_ids: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("line {line}: {why}")]
    Line { line: usize, why: String },
    #[error("read: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads a whole trace; a malformed line is an error naming it (nothing is skipped
/// silently). Blank lines are allowed.
pub fn read(r: impl BufRead) -> Result<Vec<Request>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in r.lines().enumerate() {
        let line = line?;
        let n = i + 1;
        if line.len() > LINE_BYTES_MAX {
            return Err(TraceError::Line {
                line: n,
                why: format!("longer than {LINE_BYTES_MAX} bytes"),
            });
        }
        if line.trim().is_empty() {
            continue;
        }
        let req: Request = serde_json::from_str(&line).map_err(|e| TraceError::Line {
            line: n,
            why: e.to_string(),
        })?;
        if let Some(prev) = out.last().map(|r: &Request| r.timestamp) {
            if req.timestamp < prev {
                return Err(TraceError::Line {
                    line: n,
                    why: format!("timestamp {} before the previous {prev}", req.timestamp),
                });
            }
        }
        out.push(req);
    }
    Ok(out)
}

/// Reads a trace file.
pub fn read_file(path: &std::path::Path) -> Result<Vec<Request>, TraceError> {
    let f = std::fs::File::open(path)?;
    read(std::io::BufReader::new(f))
}

/// What a trace holds, in blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub requests: u64,
    pub block_refs: u64,
    pub unique_blocks: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub span_ms: u64,
}

pub fn summary(reqs: &[Request]) -> Summary {
    let mut seen = std::collections::HashSet::new();
    let mut s = Summary {
        requests: reqs.len() as u64,
        ..Summary::default()
    };
    for r in reqs {
        s.block_refs += r.hash_ids.len() as u64;
        s.input_tokens += r.input_length;
        s.output_tokens += r.output_length;
        seen.extend(r.hash_ids.iter().copied());
    }
    s.unique_blocks = seen.len() as u64;
    s.span_ms = match (reqs.first(), reqs.last()) {
        (Some(a), Some(b)) => b.timestamp - a.timestamp,
        _ => 0,
    };
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_bad_ones_are_named() {
        let t =
            "{\"timestamp\":0,\"input_length\":600,\"output_length\":10,\"hash_ids\":[1,2]}\n\n\
                 {\"timestamp\":5,\"input_length\":100,\"output_length\":1,\"hash_ids\":[1]}\n";
        let r = read(t.as_bytes()).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].hash_ids, [1, 2]);
        let s = summary(&r);
        assert_eq!((s.block_refs, s.unique_blocks, s.span_ms), (3, 2, 5));
        let bad = "{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\n{\"timestamp\":1}\n";
        let e = read(bad.as_bytes()).unwrap_err().to_string();
        assert!(e.starts_with("line 2:"), "{e}");
        let back = "{\"timestamp\":9,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\n{\"timestamp\":1,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\n";
        assert!(read(back.as_bytes())
            .unwrap_err()
            .to_string()
            .contains("before"));
    }
}
