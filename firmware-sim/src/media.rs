//! The durable medium: what survives a power cut. In memory (chunks allocated on first
//! write, so a multi-GiB device costs only what is written) or in a sparse file (survives the
//! process, for `ctxpod serve --device sim:…`). Unwritten bytes read as zeros.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

const CHUNK: usize = 1 << 20;

pub enum Media {
    Memory {
        len: u64,
        chunks: Vec<Option<Box<[u8]>>>,
    },
    File {
        len: u64,
        file: File,
    },
    /// Keeps nothing (reads zeros): for timing and wear runs that never look at data.
    Discard {
        len: u64,
    },
}

impl Media {
    pub fn memory(len: u64) -> Media {
        Media::Memory {
            len,
            chunks: (0..len.div_ceil(CHUNK as u64)).map(|_| None).collect(),
        }
    }

    /// A sparse file of `len` bytes, created if missing (its contents are kept).
    pub fn file(path: &Path, len: u64) -> io::Result<Media> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() != len {
            file.set_len(len)?;
        }
        Ok(Media::File { len, file })
    }

    pub fn len(&self) -> u64 {
        match self {
            Media::Memory { len, .. } | Media::File { len, .. } | Media::Discard { len } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self {
            Media::File { file, .. } => file.read_exact_at(buf, offset),
            Media::Discard { .. } => {
                buf.fill(0);
                Ok(())
            }
            Media::Memory { chunks, .. } => {
                let mut done = 0;
                for (c, o, n) in pieces(offset, buf.len()) {
                    let out = &mut buf[done..done + n];
                    match &chunks[c] {
                        Some(chunk) => out.copy_from_slice(&chunk[o..o + n]),
                        None => out.fill(0),
                    }
                    done += n;
                }
                Ok(())
            }
        }
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        match self {
            Media::File { file, .. } => file.write_all_at(data, offset),
            Media::Discard { .. } => Ok(()),
            Media::Memory { chunks, .. } => {
                let mut done = 0;
                for (c, o, n) in pieces(offset, data.len()) {
                    chunks[c].get_or_insert_with(|| vec![0u8; CHUNK].into_boxed_slice())[o..o + n]
                        .copy_from_slice(&data[done..done + n]);
                    done += n;
                }
                Ok(())
            }
        }
    }
}

/// The pieces of `len` bytes at `offset` in memory media: (chunk, offset in it, length),
/// in order, none crossing a chunk's end.
fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let end = offset + len as u64;
    let mut at = offset;
    std::iter::from_fn(move || {
        (at < end).then(|| {
            let (c, o) = ((at / CHUNK as u64) as usize, (at % CHUNK as u64) as usize);
            let n = ((end - at) as usize).min(CHUNK - o);
            at += n as u64;
            (c, o, n)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_and_file_agree() {
        let dir = std::env::temp_dir().join(format!("sim-media-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let len = 5 * CHUNK as u64 + 4096;
        let mut m = [
            Media::memory(len),
            Media::file(&dir.join("m"), len).expect("file"),
        ];
        let data: Vec<u8> = (0..3 * CHUNK + 100).map(|i| (i % 251) as u8).collect();
        for m in &mut m {
            m.write(CHUNK as u64 - 50, &data).expect("write");
            let mut got = vec![1u8; data.len() + 200];
            m.read(CHUNK as u64 - 150, &mut got).expect("read");
            assert!(got[..100].iter().all(|&b| b == 0));
            assert_eq!(&got[100..100 + data.len()], &data[..]);
            assert!(got[100 + data.len()..].iter().all(|&b| b == 0));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
