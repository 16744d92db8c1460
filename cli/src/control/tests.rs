use std::io::{self, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use super::client::read_data_reply;
use super::show::{ct_row, service_names, write_conntrack_reply};
use super::*;

const GW_MAC: tapyard::MacAddr = tapyard::MacAddr([2, 0, 0, 0, 0, 1]);

/// A datapath with NAT whose conntrack holds `n` connections, inserted through the
/// library: UDP from pods (connection `i` from 10.244.0.0 + i/64, port 1024 + i%64) to a
/// DNS Service's endpoint (DNAT'd, tagged with the Service), every 8th a TCP SYN with no
/// NAT. Port 0 (`pod`) and port 1 (`endpoint`) are on the pods' bridge.
fn conntrack_filled(n: u32) -> (tapyard::Datapath, tapyard::Instant) {
    use std::net::{Ipv4Addr, SocketAddrV4};
    use tapyard::conntrack::{tcp::flags, CtTag, Pkt};
    use tapyard::wire::family::IpProto;
    use tapyard::wire::tuple::{L4Kind, Tuple};
    let mut b = tapyard::Datapath::builder();
    let br = b.add_bridge(tapyard::BridgeConfig::new("cni0")).unwrap();
    b.add_port("pod", Some(br)).unwrap();
    b.add_port("endpoint", Some(br)).unwrap();
    let (gw, _) = b
        .add_router_iface(
            tapyard::l3::IfaceConfig::new("cni0", GW_MAC, Ipv4Addr::new(10, 244, 0, 1), 16),
            Some(br),
        )
        .unwrap();
    b.netfilter(tapyard::nat::NatConfig::default()).unwrap();
    let dp = b.build();
    let now = tapyard::Instant::from_secs(5);
    let nf = dp.control().netfilter().unwrap();
    let mut dns =
        tapyard::nat::ServiceSpec::new("dns", Ipv4Addr::new(10, 96, 0, 53), 53, IpProto::UDP);
    let ep = SocketAddrV4::new(Ipv4Addr::new(10, 244, 9, 9), 5353);
    let ep_mac = tapyard::MacAddr([2, 0, 0, 0, 9, 9]);
    dp.control()
        .add_static_neigh(gw, *ep.ip(), ep_mac, now)
        .unwrap();
    dns.endpoints = vec![tapyard::nat::Endpoint::new(ep, true)];
    let id = nf.upsert_service(dns, now).unwrap().get();
    for i in 0..n {
        let src = Ipv4Addr::from(0x0af4_0000 | (i >> 6));
        let sport = u16::try_from(1024 + (i & 63)).unwrap();
        let (orig, reply, tag, pkt) = if i % 8 == 7 {
            let orig = Tuple {
                src,
                dst: Ipv4Addr::new(192, 0, 2, 1),
                sport,
                dport: 443,
                proto: 6,
                zone: 0,
            };
            let syn = Pkt {
                kind: L4Kind::Tcp,
                tcp_flags: flags::SYN,
                len: 60,
            };
            (orig, orig.invert(), CtTag::default(), syn)
        } else {
            let orig = Tuple {
                src,
                dst: Ipv4Addr::new(10, 96, 0, 53),
                sport,
                dport: 53,
                proto: 17,
                zone: 0,
            };
            let reply = Tuple {
                src: *ep.ip(),
                sport: ep.port(),
                ..orig.invert()
            };
            let tag = CtTag {
                service: id,
                endpoint: u32::from(*ep.ip()),
                ..CtTag::default()
            };
            let udp = Pkt {
                kind: L4Kind::Udp,
                tcp_flags: 0,
                len: 80,
            };
            (orig, reply, tag, udp)
        };
        nf.conntrack().insert(orig, reply, tag, &pkt, now).unwrap();
    }
    assert_eq!(nf.conntrack().len(), usize::try_from(n).unwrap());
    (dp, now)
}

/// The rows as `show conntrack --json` built them before it was streamed: one
/// `serde_json::Value` (the format the streamed reply must keep).
fn conntrack_rows_as_values(nf: &tapyard::nat::Netfilter, now: tapyard::Instant) -> Value {
    let tuple = |t: &tapyard::wire::tuple::Tuple| json!({"src": t.src.to_string(), "dst": t.dst.to_string(), "sport": t.sport, "dport": t.dport});
    let names = service_names(nf);
    let rows = nf
        .conntrack()
        .dump(now)
        .into_iter()
        .map(|v| {
            json!({
                "protocol": v.protocol,
                "proto": v.proto,
                "state": v.state.map(|s| s.name()),
                "timeout_secs": v.timeout_secs,
                "orig": tuple(&v.orig),
                "reply": tuple(&v.reply),
                "orig_packets": v.orig_packets,
                "orig_bytes": v.orig_bytes,
                "reply_packets": v.reply_packets,
                "reply_bytes": v.reply_bytes,
                "assured": v.assured,
                "unreplied": v.unreplied,
                "snat": v.status.snat(),
                "dnat": v.status.dnat(),
                "mark": v.mark,
                "service": names.get(&v.service),
                "service_id": v.service,
                "zone": v.orig.zone,
            })
        })
        .collect();
    Value::Array(rows)
}

/// The streamed reply carries the rows the `Value`-built one did, and the client prints
/// them byte for byte as before (`to_string_pretty` of the data, then a newline); an
/// empty table and a table-less reply print as before too.
#[test]
fn streamed_conntrack_rows_keep_their_format() {
    let (dp, now) = conntrack_filled(100);
    let nf = dp.control().netfilter().unwrap();
    let want = conntrack_rows_as_values(nf, now);
    assert_eq!(want.as_array().unwrap().len(), 100);
    let mut line = Vec::new();
    write_conntrack_reply(nf, now, false, &mut line).unwrap();
    assert_eq!(line.last(), Some(&b'\n'), "one line");
    let v: Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(v, json!({"ok": true, "data": want}));
    let mut printed = Vec::new();
    let rest = read_data_reply(&mut &line[..], &mut printed).unwrap();
    assert_eq!(rest, Reply::data(true));
    let old = format!("{}\n", serde_json::to_string_pretty(&want).unwrap());
    assert_eq!(String::from_utf8(printed).unwrap(), old);
    // As one value (nat_show), the same rows.
    let names = service_names(nf);
    let dump = nf.conntrack().dump(now);
    let rows: Vec<_> = dump.iter().map(|e| ct_row(e, &names)).collect();
    assert_eq!(serde_json::to_value(rows).unwrap(), want);
    // Replies that are not streamed read as before.
    for (reply, text) in [
        (json!({"ok": true, "data": []}), "[]\n"),
        (
            json!({"ok": true, "data": {"b": 1, "a": [1, 2]}}),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": 1\n}\n",
        ),
        (json!({"ok": true, "text": "x\n"}), ""),
        (json!({"ok": false, "error": "no"}), ""),
    ] {
        let mut printed = Vec::new();
        let line = format!("{reply}\n");
        let rest = read_data_reply(&mut line.as_bytes(), &mut printed).unwrap();
        assert_eq!(String::from_utf8(printed).unwrap(), text, "{reply}");
        assert_eq!(Some(rest.ok), reply["ok"].as_bool());
        assert_eq!(rest.text.as_deref(), reply["text"].as_str());
        assert_eq!(rest.error.as_deref(), reply["error"].as_str());
    }
    let mut sink = Vec::new();
    assert!(read_data_reply(&mut &b"{\"ok\":tru"[..], &mut sink).is_err());
}

/// `show conntrack --json` of a table filled to 131,072 and 262,144 connections (the
/// default `max_entries`), as the control socket serves it and the client prints it, the
/// two ends on a socket pair; and how the same table fared the way it was answered before
/// (rows built as one `serde_json::Value`, written as one string; the client parsing the
/// line into a `Value` and pretty-printing it). Meanwhile a worker thread keeps running
/// the datapath: the longest it waited between two batches is printed. Figures, not
/// pass/fail (a shared machine's timings): run with
/// `cargo test -p tapyard-cli --release --bin tapyard conntrack_dump_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn conntrack_dump_timing() {
    use std::sync::atomic::AtomicU64;
    use std::time::Instant as Clock;
    for n in [131_072, 262_144] {
        let (dp, now) = conntrack_filled(n);
        let dp = Arc::new(dp);
        let nf = dp.control().netfilter().unwrap();
        // Before: the whole reply as one value and one string, then the client's parse.
        let t = Clock::now();
        let line = json!({"ok": true, "data": conntrack_rows_as_values(nf, now)}).to_string();
        let server_old = t.elapsed();
        let v: Value = serde_json::from_str(&line).unwrap();
        let mut out = io::sink();
        writeln!(out, "{}", serde_json::to_string_pretty(&v["data"]).unwrap()).unwrap();
        let old = t.elapsed();
        drop((v, line));
        // The text form (not streamed): one string in a JSON reply, parsed whole.
        let t = Clock::now();
        let line = json!({"ok": true, "text": nf.conntrack().fmt_dump(now)}).to_string();
        let v: Value = serde_json::from_str(&line).unwrap();
        write!(out, "{}", v["text"].as_str().unwrap_or_default()).unwrap();
        let text = t.elapsed();
        drop((v, line));
        // Now: streamed over a socket pair, alone...
        let t = Clock::now();
        let (a, b) = UnixStream::pair().unwrap();
        let server = {
            let dp = dp.clone();
            std::thread::spawn(move || {
                write_conntrack_reply(dp.control().netfilter().unwrap(), now, false, &a).unwrap();
            })
        };
        let mut printed = io::BufWriter::with_capacity(1 << 20, io::sink());
        read_data_reply(&mut BufReader::with_capacity(1 << 20, &b), &mut printed).unwrap();
        server.join().unwrap();
        let alone = t.elapsed();
        // ... and with a worker forwarding meanwhile.
        let stop = Arc::new(AtomicBool::new(false));
        let gap = Arc::new(AtomicU64::new(0));
        // Connection 128's packets (10.244.0.2:1024 -> the DNS ClusterIP), 32 a batch,
        // DNAT'd and forwarded to the endpoint's port while the table is dumped.
        let frame = udp_frame([10, 244, 0, 2], 1024, [10, 96, 0, 53], 53);
        let worker = {
            let (dp, stop, gap) = (dp.clone(), stop.clone(), gap.clone());
            std::thread::spawn(move || {
                let mut w = dp.worker();
                let mut last = Clock::now();
                let mut forwarded = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut batch = tapyard::Batch::new();
                    for _ in 0..tapyard::BATCH_SIZE {
                        let mut b = tapyard::PacketBuf::from_frame(&frame);
                        b.port = tapyard::PortId(0);
                        batch.push(b).unwrap();
                    }
                    dp.process(&mut w, now, &mut batch);
                    let sent = batch.verdicts().iter().filter(|v| {
                        matches!(v, tapyard::Verdict::Output(_) | tapyard::Verdict::Flood(_))
                    });
                    forwarded += sent.count() as u64;
                    dp.dispatch(&mut w, &batch, |_, _| Ok(()));
                    batch.recycle(&mut w.pool);
                    let us = u64::try_from(last.elapsed().as_micros()).unwrap_or(u64::MAX);
                    gap.fetch_max(us, Ordering::Relaxed);
                    last = Clock::now();
                }
                forwarded
            })
        };
        let (a, b) = UnixStream::pair().unwrap();
        let t = Clock::now();
        let server = {
            let dp = dp.clone();
            std::thread::spawn(move || {
                let cpu = thread_cpu();
                write_conntrack_reply(dp.control().netfilter().unwrap(), now, false, &a).unwrap();
                thread_cpu() - cpu
            })
        };
        let cpu = thread_cpu();
        let mut printed = io::BufWriter::with_capacity(1 << 20, io::sink());
        let rest =
            read_data_reply(&mut BufReader::with_capacity(1 << 20, &b), &mut printed).unwrap();
        let client_cpu = thread_cpu() - cpu;
        let server_cpu = server.join().unwrap();
        let new = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        let forwarded = worker.join().unwrap();
        assert!(forwarded > 0, "the worker forwarded nothing");
        assert!(rest.ok);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "{n} connections: before {:.0} ms (server {:.0} ms); streamed {:.0} ms alone, \
             {:.0} ms beside a busy worker \
             (CPU: server {:.0} ms, client {:.0} ms); a worker DNAT'd and forwarded \
             {forwarded} frames meanwhile, longest gap between batches {:.1} ms; load \
             average {}; text form (not streamed) {:.0} ms",
            old.as_secs_f64() * 1e3,
            server_old.as_secs_f64() * 1e3,
            alone.as_secs_f64() * 1e3,
            new.as_secs_f64() * 1e3,
            server_cpu as f64 / 1e6,
            client_cpu as f64 / 1e6,
            gap.load(Ordering::Relaxed) as f64 / 1e3,
            load.split_whitespace().next().unwrap_or("?"),
            text.as_secs_f64() * 1e3,
        );
    }
}

/// An Ethernet + IPv4 + UDP frame from a pod to the gateway's MAC (UDP checksum 0).
fn udp_frame(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 7, 7, 0x08, 0x00];
    let ip = [&[0x45, 0, 0, 32, 0, 1, 0, 0, 64, 17, 0, 0][..], &src, &dst].concat();
    let mut sum: u32 = ip
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f.extend_from_slice(&ip);
    f[24..26].copy_from_slice(&(!u16::try_from(sum).unwrap()).to_be_bytes());
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 12, 0, 0, b'p', b'i', b'n', b'g']);
    f
}

/// Nanoseconds this thread has run on a CPU (`/proc/thread-self/schedstat`).
fn thread_cpu() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_live_socket_is_refused_and_a_stale_one_removed() {
    let dir = std::env::temp_dir().join(format!("tapyard-ctl-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("x.sock");
    let _ = std::fs::remove_file(&path);
    claim_socket(&path).unwrap();
    let l = bind(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(claim_socket(&path).unwrap_err().contains("already running"));
    drop(l);
    claim_socket(&path).unwrap();
    assert!(!path.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
