//! Hosts of a test network, each in a network namespace of its own, on one bridge the test
//! makes: a pod's nodes and its etcd as separate hosts, reachable from the test process
//! (which stays in the machine's namespace, on the bridge's own address), so that the test
//! can cut links for real with `nftables` inside a host's namespace.
//!
//! - [`Lan::new`] makes the bridge (a /24 of 10.0.0.0/8 no interface of the machine uses),
//!   one namespace and veth pair per host, and brings them up; [`Drop`] removes them all.
//! - [`Lan::cut`] drops every packet between a host and the hosts named (both ways, as a
//!   black hole: no reset, no ICMP, the peer's sends time out); [`Lan::cut_one_way`] only
//!   what the host sends them; [`Lan::isolate`] cuts a host from every other host and from
//!   the test process; [`Lan::heal`] lifts the cuts.
//! - [`Lan::command`] runs a program inside a host (`ip netns exec`, which execs it: the
//!   child's pid is the program's own, so signals reach it).
//!
//! Needs root (or CAP_NET_ADMIN), `ip` (iproute2) and `nft` (nftables): scripts/setup-deps.sh
//! installs them. Only addresses inside the bridge's /24 are used.

use std::collections::BTreeMap;
use std::process::Command;

/// One host of a [`Lan`]: its namespace and its address on the bridge.
#[derive(Debug, Clone)]
pub struct Host {
    /// The host's name in the test (`a`, `etcd`).
    pub name: String,
    /// The network namespace it lives in.
    pub netns: String,
    /// Its IPv4 address on the bridge.
    pub ip: String,
}

/// A bridge with hosts on it, each in its own namespace; removed when dropped.
pub struct Lan {
    /// The bridge's name (`cx` and six hex digits).
    bridge: String,
    /// The test process's own address on the bridge (what clients come from).
    pub gateway: String,
    hosts: BTreeMap<String, Host>,
    /// The veth ends left in the machine's namespace, by host.
    veths: BTreeMap<String, String>,
}

/// Runs `ip`, `nft` or another tool; panics with its output when it fails.
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e} (scripts/setup-deps.sh installs it)"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The /24 prefixes (`10.x.y`) the machine's interfaces use now.
fn used_prefixes() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("ip addr (iproute2)");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("10."))
        .filter_map(|w| {
            let mut it = w.split('.');
            Some(format!("10.{}.{}", it.next()?, it.next()?))
        })
        .collect()
}

impl Lan {
    /// A bridge and one namespace per name of `hosts` (at most 200), each host with
    /// loopback and one address on the bridge, all up.
    pub fn new(hosts: &[&str]) -> Lan {
        assert!(hosts.len() <= 200, "at most 200 hosts on one bridge");
        // SAFETY: geteuid(2) has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "network namespaces need root (CAP_NET_ADMIN): run the pod partition tests as root"
        );
        let tag = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
        let used = used_prefixes();
        let prefix = loop {
            let p = format!(
                "10.{}.{}",
                64 + rand::random::<u8>() % 128,
                rand::random::<u8>()
            );
            if !used.contains(&p) {
                break p;
            }
        };
        let mut lan = Lan {
            bridge: format!("cx{tag}"),
            gateway: format!("{prefix}.1"),
            hosts: BTreeMap::new(),
            veths: BTreeMap::new(),
        };
        run("ip", &["link", "add", &lan.bridge, "type", "bridge"]);
        let gw = format!("{}/24", lan.gateway);
        run("ip", &["addr", "add", &gw, "dev", &lan.bridge]);
        run("ip", &["link", "set", &lan.bridge, "up"]);
        for (i, name) in hosts.iter().enumerate() {
            let netns = format!("ctxpod-{tag}-{name}");
            let veth = format!("cx{tag}{i:02x}");
            let ip = format!("{prefix}.{}", 10 + i);
            run("ip", &["netns", "add", &netns]);
            run(
                "ip",
                &[
                    "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns,
                ],
            );
            run("ip", &["link", "set", &veth, "master", &lan.bridge, "up"]);
            let addr = format!("{ip}/24");
            run("ip", &["-n", &netns, "addr", "add", &addr, "dev", "eth0"]);
            run("ip", &["-n", &netns, "link", "set", "lo", "up"]);
            run("ip", &["-n", &netns, "link", "set", "eth0", "up"]);
            lan.veths.insert(name.to_string(), veth);
            lan.hosts.insert(
                name.to_string(),
                Host {
                    name: name.to_string(),
                    netns,
                    ip,
                },
            );
        }
        lan
    }

    /// Host `name`.
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .get(name)
            .unwrap_or_else(|| panic!("no host {name} on this LAN"))
    }

    /// A command that runs `program` inside host `name`'s namespace.
    pub fn command(&self, name: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.host(name).netns])
            .arg(program);
        c
    }

    /// Drops every packet between host `name` and the hosts `from` (names; the test
    /// process is [`Lan::gateway`]'s, named `"gateway"`), both ways. Adds to any cut
    /// already in force on that host.
    pub fn cut(&self, name: &str, from: &[&str]) {
        self.cut_ways(name, from, true);
    }

    /// Drops every packet host `name` sends to the hosts `to`; what they send it still
    /// arrives (a one-way cut: for TCP, connections either way stall).
    pub fn cut_one_way(&self, name: &str, to: &[&str]) {
        self.cut_ways(name, to, false);
    }

    fn cut_ways(&self, name: &str, from: &[&str], both: bool) {
        let ips: Vec<String> = from
            .iter()
            .map(|f| match *f {
                "gateway" => self.gateway.clone(),
                f => self.host(f).ip.clone(),
            })
            .collect();
        let set = ips.join(", ");
        let netns = &self.host(name).netns;
        let input = if both {
            format!("ip saddr {{ {set} }} drop;")
        } else {
            String::new()
        };
        let rules = format!(
            "table inet ctxpod_cut {{\n\
             chain input {{ type filter hook input priority 0; {input} }}\n\
             chain output {{ type filter hook output priority 0; ip daddr {{ {set} }} drop; }}\n\
             }}\n"
        );
        let file = std::env::temp_dir().join(format!("{netns}.nft"));
        std::fs::write(&file, rules).expect("write the nft rules");
        let f = file.to_string_lossy().to_string();
        run("ip", &["netns", "exec", netns, "nft", "-f", &f]);
        let _ = std::fs::remove_file(file);
    }

    /// Cuts host `name` from every other host and from the test process.
    pub fn isolate(&self, name: &str) {
        let others: Vec<&str> = self
            .hosts
            .keys()
            .map(String::as_str)
            .filter(|h| *h != name)
            .chain(["gateway"])
            .collect();
        self.cut(name, &others);
    }

    /// Lifts every cut on host `name`.
    pub fn heal(&self, name: &str) {
        let netns = &self.host(name).netns;
        let _ = Command::new("ip")
            .args([
                "netns",
                "exec",
                netns,
                "nft",
                "delete",
                "table",
                "inet",
                "ctxpod_cut",
            ])
            .output();
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for h in self.hosts.values() {
            // Whatever still runs in the namespace (a process the test lost track of).
            if let Ok(out) = Command::new("ip")
                .args(["netns", "pids", &h.netns])
                .output()
            {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: kill(2) with a pid read from the namespace's process list.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
            let _ = Command::new("ip").args(["netns", "del", &h.netns]).output();
        }
        for v in self.veths.values() {
            let _ = Command::new("ip").args(["link", "del", v]).output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}
