//! The client subcommands of `ctxpod` (put, get, stat, ns, plan, match, prefetch, events,
//! drain, repair, token, hash): each talks to a node over HTTP or CXP1, or works locally.

use super::{parse_key, Creds, Target, Wire};
use anyhow::Context;
use bytes::Bytes;
use ctxpod_client::client::PutOutcome;
use ctxpod_format::config::ByteSize;
use ctxpod_wire::block_hash;
use ctxpod_wire::Durability;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
/// Parses lowercase-hex keys, in order, as the wire takes them.
pub(super) fn parse_keys(keys: &[String]) -> anyhow::Result<Vec<Bytes>> {
    keys.iter().map(|k| parse_key(k).map(Bytes::from)).collect()
}

/// `ctxpod put`: stores a block read from `file` (`-`: stdin).
pub(super) async fn put(
    t: &Target,
    key: &str,
    file: &std::path::Path,
    fast: bool,
) -> anyhow::Result<ExitCode> {
    let key = parse_key(key)?;
    let mut data = Vec::new();
    if file.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut data)?;
    } else {
        data = std::fs::read(file).with_context(|| format!("read {}", file.display()))?;
    }
    let d = if fast {
        Durability::Fast
    } else {
        Durability::Durable
    };
    let n = data.len();
    let out = t
        .creds
        .http(&t.addr)?
        .put(&t.ns, &key, Bytes::from(data), d)
        .await?;
    let what = match out {
        PutOutcome::Created => "stored",
        PutOutcome::Exists => "already stored",
    };
    eprintln!("{what}: {n} bytes");
    Ok(ExitCode::SUCCESS)
}

/// `ctxpod get`: fetches a block to `output` (or stdout); exit code 4 when it is not found.
pub(super) async fn get(
    t: &Target,
    key: &str,
    output: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let key = parse_key(key)?;
    match t.creds.http(&t.addr)?.get(&t.ns, &key).await? {
        Some(b) => {
            match output {
                Some(p) => {
                    std::fs::write(&p, &b).with_context(|| format!("write {}", p.display()))?
                }
                None => std::io::stdout().write_all(&b)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        None => {
            eprintln!("not found");
            Ok(ExitCode::from(4))
        }
    }
}

/// `ctxpod stat`: prints the node's statistics as JSON.
pub(super) async fn stat(t: &Target) -> anyhow::Result<ExitCode> {
    let s = t.creds.http(&t.addr)?.stats().await?;
    println!("{}", serde_json::to_string_pretty(&s)?);
    Ok(ExitCode::SUCCESS)
}

/// `ctxpod plan`: sizes a pod, from the pod's live hit-ratio curve with `--live`.
pub(super) async fn plan(
    args: &ctxpod_node::plan_args::PlanArgs,
    addr: &str,
    creds: &Creds,
) -> anyhow::Result<ExitCode> {
    let live = if args.live {
        Some(creds.http(addr)?.pod_mrc().await?)
    } else {
        None
    };
    ctxpod_node::plan_args::run(args, live.as_ref())?;
    Ok(ExitCode::SUCCESS)
}

/// `ctxpod match`: prints how many leading keys of the chain the node holds.
pub(super) async fn match_chain(t: &Wire, keys: &[String]) -> anyhow::Result<ExitCode> {
    let keys = parse_keys(keys)?;
    let c = t.creds.wire(&t.transfer).await?;
    println!("{}", c.match_prefix(&t.ns, &keys).await?);
    Ok(ExitCode::SUCCESS)
}

/// `ctxpod ns`: lists namespaces, or creates (`create`) or deletes (`delete`) `t.ns`.
pub(super) async fn ns(
    t: &Target,
    create: bool,
    delete: bool,
    quota: Option<ByteSize>,
) -> anyhow::Result<ExitCode> {
    let c = t.creds.http(&t.addr)?;
    if create {
        let info = c.create_namespace(&t.ns, quota.map(|q| q.0)).await?;
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else if delete {
        c.delete_namespace(&t.ns).await?;
        eprintln!("deleted namespace {}", t.ns);
    } else {
        println!("{}", serde_json::to_string_pretty(&c.namespaces().await?)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// `ctxpod events`: prints a namespace's KV events until the subscription ends or `count`.
pub(super) async fn events(t: &Wire, count: Option<u64>) -> anyhow::Result<ExitCode> {
    let c = t.creds.wire(&t.transfer).await?;
    let mut sub = c.subscribe(&t.ns).await?;
    let mut seen = 0u64;
    while let Some(b) = sub.next().await {
        if b.lost > 0 {
            println!("lost {}", b.lost);
        }
        for (kind, key) in b.events {
            println!("{} {}", kind.name(), hex::encode(&key));
            seen += 1;
            if count.is_some_and(|c| seen >= c) {
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
    eprintln!("the subscription ended (namespace deleted or connection closed)");
    Ok(ExitCode::SUCCESS)
}

/// `ctxpod token create`: makes a token (and with `s3` an S3 secret) and prints or writes
/// the node's entry for it.
pub(super) fn token_create(
    id: &str,
    role: &str,
    tenant: Option<&str>,
    s3: bool,
    dir: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        ctxpod_wire::proto::Role::parse(role).is_some(),
        "--role must be admin, viewer, tenant-rw or tenant-ro"
    );
    anyhow::ensure!(
        (role == "admin" || role == "viewer") == tenant.is_none(),
        "a tenant role needs --tenant; an admin or a viewer has none"
    );
    if let Some(t) = tenant {
        ctxpod_wire::namespace::check_tenant_name(t)?;
    }
    let (token, hash) = ctxpod_node::auth::new_token(id).map_err(anyhow::Error::msg)?;
    let tenant_line = tenant
        .map(|t| format!("tenant = \"{t}\"\n"))
        .unwrap_or_default();
    let s3_secret = s3.then(ctxpod_node::auth::new_s3_secret);
    let s3_line = s3_secret
        .as_ref()
        .map(|k| format!("s3_secret = \"{}\"\n", k.as_str()))
        .unwrap_or_default();
    let entry = format!("role = \"{role}\"\n{tenant_line}hash = \"{hash}\"\n{s3_line}");
    match dir {
        Some(d) => write_token_entry(d, id, &entry)?,
        None => eprintln!("[[auth.tokens]]\nid = \"{id}\"\n{entry}"),
    }
    println!("{}", &*token);
    if let Some(k) = &s3_secret {
        println!("aws_access_key_id = {id}");
        println!("aws_secret_access_key = {}", k.as_str());
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes a token's entry as `<dir>/<id>` (mode 0600, never over an existing file).
pub(super) fn write_token_entry(
    dir: &std::path::Path,
    id: &str,
    entry: &str,
) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir)?;
    let path = dir.join(id);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    f.write_all(entry.as_bytes())?;
    eprintln!("wrote {} (send the node SIGHUP to load it)", path.display());
    Ok(())
}

/// `ctxpod hash`: prints the chained block hashes of `tokens` as keys.
pub(super) fn hash(
    block_size: usize,
    salt: Option<&str>,
    lora: Option<&str>,
    tokens: &[u32],
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(block_size > 0, "--block-size must be at least 1");
    let seed = block_hash::salt_hash(salt, lora);
    for h in block_hash::sequence_hashes(tokens, block_size, seed) {
        println!("{}", hex::encode(block_hash::key_of(h)));
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn prefetch(
    t: Wire,
    keys: Vec<String>,
    policy: &str,
    deadline_ms: Option<u64>,
    max_len: ByteSize,
    output: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use ctxpod_client::region::Region;
    use ctxpod_client::transfer_client::{BlockState, PrefetchOptions};
    use ctxpod_wire::proto::{Policy, PrefetchEntry};
    let policy = match policy {
        "best-effort" => Policy::BestEffort,
        "wait-complete" => Policy::WaitComplete,
        "timeout" => Policy::Timeout,
        p => anyhow::bail!("unknown policy {p:?} (best-effort, wait-complete, timeout)"),
    };
    let slot = max_len.0.clamp(1, ctxpod_wire::BLOCK_BYTES_MAX as u64) as usize;
    let raw = parse_keys(&keys)?;
    let c = t.creds.wire(&t.transfer).await?;
    let region = Region::new(slot * raw.len())?;
    c.register_region(&region).await?;
    let entries = raw
        .iter()
        .enumerate()
        .map(|(i, k)| PrefetchEntry {
            key: k.clone(),
            offset: (i * slot) as u64,
            max_len: slot as u32,
        })
        .collect();
    let opts = PrefetchOptions {
        policy,
        deadline: deadline_ms.map(std::time::Duration::from_millis),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let ticket = c.prefetch(&t.ns, &region, entries, opts).await?;
    let mut bytes = 0u64;
    for (i, k) in keys.iter().enumerate() {
        let st = ticket.block(i).await;
        match st {
            BlockState::Landed { len } => {
                bytes += len as u64;
                eprintln!("[{}/{}] {k}: {len} bytes landed", i + 1, keys.len());
                if let Some(dir) = &output {
                    std::fs::create_dir_all(dir)?;
                    let data = ticket.data(i).context("a landed block has bytes")?;
                    std::fs::write(dir.join(k), data)?;
                }
            }
            other => eprintln!("[{}/{}] {k}: {other:?}", i + 1, keys.len()),
        }
    }
    let p = ticket.wait().await;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{} landed, {} missed, {} bytes in {:.3} s ({:.3} GB/s)",
        p.landed,
        p.missed,
        bytes,
        secs,
        bytes as f64 / secs / 1e9
    );
    Ok(if p.missed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(4)
    })
}

/// `ctxpod drain`: starts (or with `cancel` takes back) the node's drain; `wait`: shows
/// progress until it is drained.
pub(super) async fn drain(
    addr: &str,
    creds: &Creds,
    wait: bool,
    cancel: bool,
) -> anyhow::Result<ExitCode> {
    let c = creds.http(addr)?;
    let mut s = if cancel {
        c.undrain().await?
    } else {
        c.drain().await?
    };
    while wait && s.state != "drained" {
        eprint!(
            "\rdrain: {} after {} passes (last: {} blocks looked at, {} copied, {} failed)   ",
            s.state, s.passes, s.last_scanned, s.last_copied_blocks, s.last_failed
        );
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        s = c.drain_status().await?;
    }
    if wait {
        eprintln!();
    }
    println!("{}", serde_json::to_string_pretty(&s)?);
    Ok(ExitCode::SUCCESS)
}

/// `ctxpod repair`: asks every member of the pod (as `addr` sees it) for a backfill pass;
/// `wait`: follows them until, on every member, a pass begun after its ask ran to its end
/// and found nothing to copy (a member whose pass copied some is asked again), or
/// `timeout`. Members that join meanwhile are asked when first seen; one that cannot be
/// reached is waited for (it leaves the view when its lease runs out).
pub(super) async fn repair(
    addr: &str,
    creds: &Creds,
    wait: bool,
    timeout: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    use std::collections::BTreeMap;
    let seed = creds.http(addr)?;
    let started = std::time::Instant::now();
    // Per member: the pass to wait for.
    let mut asked: BTreeMap<String, u64> = BTreeMap::new();
    let mut copied = 0u64;
    loop {
        let members = seed.cluster().await?.members;
        let mut pending = Vec::new();
        for m in &members {
            let c = creds.http(&m.http)?;
            let done = match asked.get(&m.id) {
                Some(&pass) => match c.repair_status().await {
                    Ok(s) if s.passes_done >= pass => {
                        let clean = s.last_ok && !s.last_restarted;
                        if clean && s.last_copied_blocks == 0 && s.last_failed == 0 {
                            true
                        } else {
                            copied += s.last_copied_blocks;
                            asked.remove(&m.id);
                            false
                        }
                    }
                    _ => false,
                },
                None => false,
            };
            if !done && !asked.contains_key(&m.id) {
                match c.repair().await {
                    Ok(s) => {
                        asked.insert(m.id.clone(), s.wait_for_pass);
                    }
                    Err(e) if e.status() == Some(409) => {
                        anyhow::bail!("member {} cannot repair: {e}", m.id)
                    }
                    Err(_) => {}
                }
            }
            if !done {
                pending.push(m.id.clone());
            }
        }
        if !wait {
            println!("{}", serde_json::to_string_pretty(&asked)?);
            return Ok(ExitCode::SUCCESS);
        }
        if pending.is_empty() {
            eprintln!(
                "\rrepair: every member's pass found nothing to copy ({} members, {copied} \
                 blocks copied meanwhile, {:.1} s)",
                members.len(),
                started.elapsed().as_secs_f64()
            );
            return Ok(ExitCode::SUCCESS);
        }
        if started.elapsed() > timeout {
            eprintln!("\nrepair: not done after {timeout:?}: waiting for {pending:?}");
            return Ok(ExitCode::FAILURE);
        }
        eprint!(
            "\rrepair: {} of {} members done, {copied} blocks copied so far   ",
            members.len() - pending.len(),
            members.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}
