//! The clients of a running node's control socket.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tapyard_control::{Command, PortInfo, Reply, Status};

use super::Fail;

fn client_socket(c: &crate::args::Client) -> Result<PathBuf, Fail> {
    crate::control::resolve_socket(c.socket.clone(), c.config.as_deref()).map_err(Fail::from)
}

fn fail_reply<T>(r: &Reply<T>) -> Fail {
    Fail(1, r.error_message())
}

/// `tapyard show TABLE [--json]`: a table of the running node, printed as it arrives.
pub fn show(
    what: crate::args::Table,
    json: bool,
    client: &crate::args::Client,
) -> Result<(), Fail> {
    let sock = client_socket(client)?;
    // `data` (a full conntrack table is ~100 MB of JSON) is printed as it is parsed.
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let what = what.name().to_string();
    let r = crate::control::client::request_data(&sock, Command::Show { json, what }, &mut out)?;
    if !r.ok {
        return Err(fail_reply(&r));
    }
    if let Some(t) = &r.text {
        let _ = out.write_all(t.as_bytes());
    } else if r.data.is_none() {
        let _ = out.write_all(b"null\n");
    }
    out.flush()
        .map_err(|e| Fail(1, format!("cannot write the output: {e}")))?;
    Ok(())
}

/// `tapyard status [--json]`: the running node's name, config, interfaces and ports.
pub fn status(json: bool, client: &crate::args::Client) -> Result<(), Fail> {
    let sock = client_socket(client)?;
    let r = crate::control::client::request::<Status>(&sock, Command::Status {})?;
    let d = match r {
        Reply {
            ok: true,
            data: Some(d),
            ..
        } => d,
        r => return Err(fail_reply(&r)),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&d).unwrap_or_default());
        return Ok(());
    }
    println!(
        "node {}  config {}  workers {}  socket {}",
        d.node,
        d.config,
        d.workers,
        sock.display()
    );
    for i in &d.interfaces {
        let v6 = match (&i.address6, &i.link_local6) {
            (Some(a), Some(l)) => format!(" {a} link-local {l}"),
            _ => String::new(),
        };
        println!(
            "interface {} {}{v6} mac {}",
            i.name,
            i.address.as_deref().unwrap_or("?"),
            i.mac
        );
    }
    for p in &d.ports {
        println!("port {} (TAP {})", p.name, p.tap);
    }
    let np = &d.nat.node_port_addresses;
    println!(
        "nat masquerade_all {}  random_fully {}  node_port_addresses {}",
        d.nat.masquerade_all,
        d.nat.random_fully,
        if np.is_empty() {
            "all".to_string()
        } else {
            np.join(",")
        }
    );
    Ok(())
}

/// `tapyard port add|del`: a port added to or removed from the running node.
pub fn port(op: crate::args::PortOp) -> Result<(), Fail> {
    match op {
        crate::args::PortOp::Add {
            bridge,
            name,
            mac,
            ip,
            client,
        } => {
            let sock = client_socket(&client)?;
            let cmd = Command::PortAdd {
                bridge: bridge.clone(),
                mac,
                name: name.clone(),
                ips: ip,
            };
            match crate::control::client::request::<PortInfo>(&sock, cmd)? {
                Reply {
                    ok: true,
                    data: Some(p),
                    ..
                } => println!(
                    "port {name} added to bridge {bridge}: ifindex {} mac {}",
                    p.ifindex, p.mac
                ),
                r => return Err(fail_reply(&r)),
            }
        }
        crate::args::PortOp::Del { name, client } => {
            let sock = client_socket(&client)?;
            let cmd = Command::PortDel { name: name.clone() };
            let r = crate::control::client::request::<serde::de::IgnoredAny>(&sock, cmd)?;
            if !r.ok {
                return Err(fail_reply(&r));
            }
            println!("port {name} removed");
        }
    }
    Ok(())
}

/// `tapyard reload`: the running node re-reads its config; what changed is printed.
pub fn reload(client: &crate::args::Client) -> Result<(), Fail> {
    let sock = client_socket(client)?;
    let r = crate::control::client::request::<serde::de::IgnoredAny>(&sock, Command::Reload {})?;
    let changes = r.changes.as_deref().unwrap_or_default();
    if r.ok && changes.is_empty() {
        println!("reloaded: nothing changed");
    }
    // A partly refused reload: what was applied on stdout, what was refused on stderr.
    for c in changes {
        println!("{c}");
    }
    if !r.ok {
        return Err(fail_reply(&r));
    }
    Ok(())
}

/// `tapyard capture PORT -w FILE [-c N]`: a port's frames written to a pcap file.
pub fn capture(
    port: &str,
    out: &Path,
    count: Option<u64>,
    client: &crate::args::Client,
) -> Result<(), Fail> {
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    use pcap_file::DataLink;
    let sock = client_socket(client)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let count = count.unwrap_or(0);
    let cmd = Command::Capture {
        count,
        port: port.to_string(),
    };
    let (reply, mut r) = crate::control::client::request_stream(&sock, cmd)?;
    if !reply.ok {
        return Err(fail_reply(&reply));
    }
    let file =
        std::fs::File::create(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let header = PcapHeader {
        snaplen: 262_144,
        datalink: DataLink::ETHERNET,
        ..Default::default()
    };
    let mut w = PcapWriter::with_header(std::io::BufWriter::new(file), header)
        .map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = r
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(200)));
    eprintln!(
        "capturing on {port} into {} (Ctrl-C to stop)",
        out.display()
    );
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 256 * 1024];
    let (mut frames, mut dropped) = (0u64, None);
    'read: while !stop.load(Ordering::Relaxed) {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(format!("{}: {e}", sock.display()).into()),
        }
        let mut used = 0;
        while let Some((kind, micros, data, n)) = crate::capture::decode(&pending[used..]) {
            used += n;
            if kind == crate::capture::KIND_END {
                dropped = Some(micros);
                break 'read;
            }
            let ts = Duration::from_micros(micros);
            w.write_packet(&PcapPacket::new(
                ts,
                crate::capture::frame_len32(data.len()),
                data,
            ))
            .map_err(|e| format!("{}: {e}", out.display()))?;
            frames += 1;
            if count > 0 && frames >= count {
                break 'read;
            }
        }
        pending.drain(..used);
    }
    let mut inner = w.into_writer();
    std::io::Write::flush(&mut inner).map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!(
        "{frames} frame{} written to {}{}",
        if frames == 1 { "" } else { "s" },
        out.display(),
        match dropped {
            Some(d) if d > 0 => format!(" ({d} dropped: the capture queue was full)"),
            _ => String::new(),
        }
    );
    Ok(())
}
