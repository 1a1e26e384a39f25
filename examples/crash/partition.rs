//! `--partitions N`: the order service in a network namespace of its own, cut off from the
//! rest by nftables rules inside that namespace.
//!
//! The driver makes a namespace and a veth pair (`10.231.X.1` on the host's side, `10.231.X.2`
//! inside), and runs the order service inside it with `ip netns exec`. PostgreSQL listens on
//! 127.0.0.1 of the host only: the driver relays TCP from `10.231.X.1` to it, and can slow that
//! relay down. A partition window is one of:
//!
//! * **cut**: every packet in or out of the namespace's veth dropped (nftables, inside the
//!   namespace): the client cannot reach the order service, nor the order service PostgreSQL;
//! * **loss**: one packet in ten dropped, both ways (`numgen random mod 10 0 drop`);
//! * **delay**: the relay to PostgreSQL holds every chunk for 200 ms (the kernel here has no
//!   `netem`).
//!
//! Every window ends healed; the namespace (and its veth pair) is deleted at the end. Without
//! the rights or the tools to make them, the run says why and stops: it never passes without
//! its partitions.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command as StdCommand;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;

use crate::BoxError;

/// The nftables table the rules live in, inside the namespace.
const TABLE: &str = "crash";
/// The relay's delay during a delay window.
const DELAY: Duration = Duration::from_millis(200);

/// The kinds of window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Window {
    Cut,
    Loss,
    Delay,
}

impl Window {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Window::Cut => "cut",
            Window::Loss => "loss",
            Window::Delay => "delay",
        }
    }
}

/// The namespace, its veth pair and the relay to PostgreSQL.
pub(crate) struct Net {
    pub(crate) ns: String,
    inner_if: String,
    pub(crate) inner_ip: Ipv4Addr,
    /// The host's side of the veth pair: what the order service reaches the host at.
    pub(crate) outer_ip: Ipv4Addr,
    /// The URL of PostgreSQL as the order service reaches it: through the relay.
    pub(crate) pg_url: String,
    delay_ms: Arc<AtomicU64>,
}

/// Runs a command; its failure, with what it said, is the error.
fn sh(args: &[&str]) -> Result<(), BoxError> {
    let out = StdCommand::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(())
}

/// The host and port of a `postgres://[user@]host:port/db` URL, and the URL with another
/// host and port.
fn rehost(url: &str, to: SocketAddr) -> Result<(String, String), BoxError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("not a URL: {url}"))?;
    let end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let hostport = if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:5432")
    };
    Ok((hostport, format!("{scheme}://{user}{to}{path}")))
}

impl Net {
    /// Makes the namespace, the veth pair, the nftables table and the relay to PostgreSQL.
    pub(crate) async fn create(pg_url: &str) -> Result<Net, BoxError> {
        let pid = std::process::id();
        let ns = format!("crash_{pid}");
        let outer_if = format!("cro{}", pid % 1_000_000);
        let inner_if = format!("cri{}", pid % 1_000_000);
        let subnet = (pid % 250) as u8;
        let outer_ip = Ipv4Addr::new(10, 231, subnet, 1);
        let inner_ip = Ipv4Addr::new(10, 231, subnet, 2);
        sh(&["ip", "netns", "add", &ns]).map_err(|e| {
            format!("--partitions needs network namespaces (root, and `ip` from iproute2): {e}")
        })?;
        // From here on, dropping the Net deletes the namespace.
        let mut net = Net {
            ns: ns.clone(),
            inner_if: inner_if.clone(),
            inner_ip,
            outer_ip,
            pg_url: String::new(),
            delay_ms: Arc::new(AtomicU64::new(0)),
        };
        let outer = format!("{outer_ip}/24");
        let inner = format!("{inner_ip}/24");
        for cmd in [
            vec![
                "ip", "link", "add", &outer_if, "type", "veth", "peer", "name", &inner_if,
            ],
            vec!["ip", "link", "set", &inner_if, "netns", &ns],
            vec!["ip", "addr", "add", &outer, "dev", &outer_if],
            vec!["ip", "link", "set", &outer_if, "up"],
            vec![
                "ip", "netns", "exec", &ns, "ip", "addr", "add", &inner, "dev", &inner_if,
            ],
            vec![
                "ip", "netns", "exec", &ns, "ip", "link", "set", &inner_if, "up",
            ],
            vec!["ip", "netns", "exec", &ns, "ip", "link", "set", "lo", "up"],
            vec![
                "ip", "netns", "exec", &ns, "nft", "add", "table", "inet", TABLE,
            ],
            vec![
                "ip",
                "netns",
                "exec",
                &ns,
                "nft",
                "add",
                "chain",
                "inet",
                TABLE,
                "in",
                "{ type filter hook input priority 0 ; policy accept ; }",
            ],
            vec![
                "ip",
                "netns",
                "exec",
                &ns,
                "nft",
                "add",
                "chain",
                "inet",
                TABLE,
                "out",
                "{ type filter hook output priority 0 ; policy accept ; }",
            ],
        ] {
            sh(&cmd).map_err(|e| format!("--partitions: cannot set up the namespace: {e}"))?;
        }
        // The relay to PostgreSQL, on the host's side of the veth pair.
        let listener = TcpListener::bind(SocketAddr::from((outer_ip, 0))).await?;
        let (target, url) = rehost(pg_url, listener.local_addr()?)?;
        net.pg_url = url;
        let delay = net.delay_ms.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let target = target.clone();
                let delay = delay.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    // Small messages both ways: no Nagle stalls in the relay.
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::join!(pipe(ri, wo, delay.clone()), pipe(ro, wi, delay));
                });
            }
        });
        Ok(net)
    }

    /// The command that runs `exe` inside the namespace.
    pub(crate) fn command(&self, exe: &std::path::Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns]).arg(exe);
        cmd
    }

    fn nft(&self, rule: &[&str]) -> Result<(), BoxError> {
        let mut args = vec!["ip", "netns", "exec", &self.ns, "nft"];
        args.extend_from_slice(rule);
        sh(&args)
    }

    /// Opens a window.
    pub(crate) fn open(&self, window: Window) -> Result<(), BoxError> {
        let iface = self.inner_if.as_str();
        match window {
            Window::Cut => {
                self.nft(&["add", "rule", "inet", TABLE, "in", "iifname", iface, "drop"])?;
                self.nft(&[
                    "add", "rule", "inet", TABLE, "out", "oifname", iface, "drop",
                ])
            }
            Window::Loss => {
                for (chain, dir) in [("in", "iifname"), ("out", "oifname")] {
                    self.nft(&[
                        "add", "rule", "inet", TABLE, chain, dir, iface, "numgen", "random", "mod",
                        "10", "0", "drop",
                    ])?;
                }
                Ok(())
            }
            Window::Delay => {
                self.delay_ms
                    .store(DELAY.as_millis() as u64, Ordering::SeqCst);
                Ok(())
            }
        }
    }

    /// Heals every window.
    pub(crate) fn heal(&self) -> Result<(), BoxError> {
        self.delay_ms.store(0, Ordering::SeqCst);
        self.nft(&["flush", "chain", "inet", TABLE, "in"])?;
        self.nft(&["flush", "chain", "inet", TABLE, "out"])
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth pair with it.
        if let Err(e) = sh(&["ip", "netns", "del", &self.ns]) {
            eprintln!("crash: could not delete the namespace {}: {e}", self.ns);
        }
    }
}

/// Copies one direction, holding each chunk for the current delay.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_ms: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let delay = delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
