//! The golden test: every example line of PROTOCOL.md parses into its type and is written
//! back identical, so the document and the types cannot drift; and every command and every
//! kind of reply has an example there.

use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tapyard_control::show::{
    ConntrackRow, FdbRow, NeighRow, PortRow, RouteRow, ServiceRow, Stats, VxlanRow,
};
use tapyard_control::{
    Hello, PortDeleted, PortInfo, Reply, Request, RequestLine, RowStream, Status,
};

const DOC: &str = include_str!("../PROTOCOL.md");

/// The reply line `line` read as a `Reply<T>` and written back.
fn round_trip<T: Serialize + DeserializeOwned>(line: &str) -> String {
    let r: Reply<T> = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
    let back = r.line();
    // Also what the server wrote before the replies were typed: the same data as a
    // `serde_json::Value` (its maps sorted).
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    if !line.starts_with(r#"{"ok":true,"data":["#) {
        assert_eq!(back.trim_end(), v.to_string(), "not in Value order");
    }
    back.trim_end().to_string()
}

/// The streamed reply: its rows parsed and written back with a [`RowStream`].
fn stream_round_trip(line: &str) -> String {
    let r: Reply<Vec<ConntrackRow<'static>>> = serde_json::from_str(line).unwrap();
    assert!(r.ok);
    let mut s = RowStream::begin(Vec::new()).unwrap();
    for row in r.data.unwrap() {
        s.row(&row).unwrap();
    }
    let out = String::from_utf8(s.finish().unwrap()).unwrap();
    assert!(out.ends_with('\n'));
    out.trim_end().to_string()
}

#[test]
fn every_documented_line_round_trips() {
    let mut commands = BTreeSet::new();
    let mut kinds = BTreeSet::new();
    let mut lines = 0;
    for line in DOC.lines() {
        let Some((tag, json)) = line.split_once(' ') else {
            continue;
        };
        let back = match tag {
            "request" => {
                let r = RequestLine::parse(json).unwrap_or_else(|e| panic!("{json}: {e}"));
                let cmd = match &r.request {
                    Request::Command(_) => "",
                    Request::Cni(_) => "cni ",
                };
                let v: serde_json::Value = serde_json::from_str(json).unwrap();
                commands.insert(format!("{cmd}{}", v["cmd"].as_str().unwrap()));
                r.encode()
            }
            _ => {
                let Some(kind) = tag.strip_prefix("reply:") else {
                    continue;
                };
                kinds.insert(kind);
                match kind {
                    "error" | "reload" | "capture" | "text" => round_trip::<()>(json),
                    "status" => round_trip::<Status>(json),
                    "hello" => round_trip::<Hello>(json),
                    "fdb" => round_trip::<Vec<FdbRow>>(json),
                    "neigh" => round_trip::<Vec<NeighRow>>(json),
                    "routes" => round_trip::<Vec<RouteRow>>(json),
                    "conntrack" => stream_round_trip(json),
                    "services" => round_trip::<Vec<ServiceRow>>(json),
                    "stats" => round_trip::<Stats>(json),
                    "ports" => round_trip::<Vec<PortRow>>(json),
                    "vxlan" => round_trip::<Vec<VxlanRow>>(json),
                    "port_info" => round_trip::<PortInfo>(json),
                    "port_deleted" => round_trip::<PortDeleted>(json),
                    other => panic!("PROTOCOL.md: unknown reply kind {other:?}"),
                }
            }
        };
        assert_eq!(back, json, "PROTOCOL.md's line and the types disagree");
        lines += 1;
    }
    let want_commands = [
        "capture",
        "cni port_add",
        "cni port_del",
        "cni port_show",
        "hello",
        "port_add",
        "port_del",
        "reload",
        "show",
        "status",
    ];
    assert_eq!(commands, want_commands.map(String::from).into());
    let want_kinds = [
        "capture",
        "conntrack",
        "error",
        "fdb",
        "hello",
        "neigh",
        "port_deleted",
        "port_info",
        "ports",
        "reload",
        "routes",
        "services",
        "stats",
        "status",
        "text",
        "vxlan",
    ];
    assert_eq!(kinds, want_kinds.into());
    assert!(lines > 40, "{lines} lines");
}

/// A reply's types refuse what they do not describe: an example whose field names a type
/// does not have (or lacks one it needs) would not parse, so the round trip also holds the
/// document to the field names.
#[test]
fn rows_need_their_fields() {
    let bad = r#"{"data":[{"dev":"cni0","dst":"10.244.1.0/24"}],"ok":true}"#;
    assert!(serde_json::from_str::<Reply<Vec<RouteRow>>>(bad).is_err());
    // A reply field the client does not know is ignored (a newer server may add some).
    let newer = r#"{"data":{"removed":true},"ok":true,"took_ms":3}"#;
    let r: Reply<PortDeleted> = serde_json::from_str(newer).unwrap();
    assert_eq!(r.data, Some(PortDeleted { removed: true }));
}
