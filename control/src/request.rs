//! The request lines.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::PROTOCOL_VERSION;

/// A command of the node's own clients (`tapyard status`, `show`, `reload`, `capture`,
/// `port add|del`), tagged by `cmd`. A field the command does not have is refused.
///
/// The commands without fields are struct variants: serde refuses unknown fields only for
/// those (a unit variant of a tagged enum would ignore them). The fields are in the order
/// the server declared them before the protocol had its own crate (its refusals list them
/// in that order, as before).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// A table or the counters: [`crate::show`].
    Show {
        /// fdb, neigh, routes, conntrack, services, stats, ports or vxlan.
        what: String,
        /// Structured data (`data`) instead of text (`text`).
        #[serde(default)]
        json: bool,
    },
    /// Re-read the configuration file (the reply has `changes`, and `errors` if any).
    Reload {},
    /// Stream a port's frames: a header reply line, then binary records.
    Capture {
        /// The port (TAP) name.
        port: String,
        /// Stop after this many frames (0: until the client goes away).
        #[serde(default)]
        count: u64,
    },
    /// The node's name, config file, ports and interfaces: [`crate::Status`].
    Status {},
    /// The protocol version the server speaks: [`crate::Hello`] (since version 1; a server
    /// older than the versioning refuses it as an unknown command).
    Hello {},
    /// `tapyard port add`: a TAP on `bridge` that stays in tapyard's namespace; the data is a
    /// [`crate::PortInfo`].
    PortAdd {
        /// The bridge.
        bridge: String,
        /// The TAP's (and the datapath port's) name.
        name: String,
        /// The TAP's MAC (`null`: the kernel's random one).
        #[serde(default)]
        mac: Option<String>,
        /// The addresses the port may send from (at most 4 per family): with any, and the
        /// bridge's `spoof_guard` on, the port gets a spoof guard pinning it to them and to
        /// its MAC. Absent or empty: no guard.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ips: Vec<std::net::IpAddr>,
    },
    /// `tapyard port del`: remove a port added by `port add` or the CNI plugin; the data is a
    /// [`crate::PortDeleted`].
    PortDel {
        /// The port's name (as `show ports` lists it).
        name: String,
    },
}

/// A request of the CNI plugin (a line with an `owner`), tagged by `cmd`. Its fields are
/// written in this order, as the plugin always wrote them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum CniRequest {
    /// Create a TAP port on `bridge` and hand it to the container as `ifname` in `netns`.
    PortAdd {
        /// The tapyard bridge to attach the port to.
        bridge: String,
        /// `<CNI_CONTAINERID>/<CNI_IFNAME>`: the key of the port for later requests.
        owner: String,
        /// Path of the container's network namespace (`CNI_NETNS`).
        netns: String,
        /// The interface name inside the namespace (`CNI_IFNAME`).
        ifname: String,
        /// The MTU of the interface.
        mtu: u32,
        /// The pod's addresses (IPAM's): with the bridge's `spoof_guard` on, the port may
        /// send from these and its MAC only. Absent or empty: no guard.
        #[serde(default)]
        ips: Vec<std::net::IpAddr>,
    },
    /// Remove the port of `owner`; not an error when there is none.
    PortDel {
        /// `<CNI_CONTAINERID>/<CNI_IFNAME>`.
        owner: String,
    },
    /// Describe the port of `owner`.
    PortShow {
        /// `<CNI_CONTAINERID>/<CNI_IFNAME>`.
        owner: String,
    },
}

/// Any request line: a [`Command`], or a [`CniRequest`] (`port_add`, `port_del` or
/// `port_show` with an `owner`). Either way a field the command does not have is refused,
/// the field named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Request {
    /// The node's own clients'.
    Command(Command),
    /// The CNI plugin's.
    Cni(CniRequest),
}

impl From<Command> for Request {
    fn from(c: Command) -> Request {
        Request::Command(c)
    }
}

impl From<CniRequest> for Request {
    fn from(c: CniRequest) -> Request {
        Request::Cni(c)
    }
}

impl Request {
    /// Parses a request line (without `version`: see [`RequestLine::parse`]); the error is
    /// the reply's message, `bad request: ...`.
    pub fn parse(line: &str) -> Result<Request, String> {
        RequestLine::parse(line).map(|l| l.request)
    }

    /// The request from a parsed line (a line with an `owner` is the CNI plugin's); the error
    /// is serde's message, naming a missing or unknown field.
    fn from_value(v: Value) -> Result<Request, String> {
        let cni_cmd = matches!(
            v.get("cmd").and_then(Value::as_str),
            Some("port_add" | "port_del" | "port_show")
        );
        if cni_cmd && v.get("owner").is_some() {
            let r: CniRequest = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
            refuse_unknown_fields(&v, &r)?;
            return Ok(Request::Cni(r));
        }
        serde_json::from_value(v)
            .map(Request::Command)
            .map_err(|e| e.to_string())
    }
}

impl<'de> Deserialize<'de> for Request {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Request, D::Error> {
        let v = Value::deserialize(d)?;
        Request::from_value(v).map_err(serde::de::Error::custom)
    }
}

/// Refuses a CNI request line with a field that its command does not have. Every field of
/// [`CniRequest`] is always written, so the parsed request written back has exactly the
/// fields the command knows.
fn refuse_unknown_fields(line: &Value, parsed: &CniRequest) -> Result<(), String> {
    let (Value::Object(given), Ok(Value::Object(known))) = (line, serde_json::to_value(parsed))
    else {
        return Ok(());
    };
    match given.keys().find(|k| !known.contains_key(k.as_str())) {
        None => Ok(()),
        Some(k) => {
            let expected: Vec<String> = known
                .keys()
                .filter(|f| f.as_str() != "cmd")
                .map(|f| format!("`{f}`"))
                .collect();
            Err(format!(
                "unknown field `{k}`, expected one of {}",
                expected.join(", ")
            ))
        }
    }
}

/// A request line as sent: the [`Request`] and the protocol version the client asked for.
///
/// `version` is optional in every request, the CNI plugin's included: absent, the request is
/// a version 1 request (every client before the versioning); present, it must be between 1
/// and [`PROTOCOL_VERSION`], or the server refuses the request naming both versions. A
/// client sends it only when it needs more than version 1, so that its lines stay what an
/// older server accepts (one that predates the versioning refuses `version` as an unknown
/// field: a clear error too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLine {
    /// The `version` field (absent: `None`, version 1).
    pub version: Option<u32>,
    /// The request.
    pub request: Request,
}

impl RequestLine {
    /// Parses a request line (surrounding whitespace and the newline are ignored); the
    /// error is the reply's message: `bad request: ...`, or an unsupported version.
    pub fn parse(line: &str) -> Result<RequestLine, String> {
        let bad = |e: String| format!("bad request: {e}");
        let mut v: Value = serde_json::from_str(line.trim()).map_err(|e| bad(e.to_string()))?;
        let version = match v.as_object_mut().and_then(|m| m.remove("version")) {
            None => None,
            Some(n) => match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n @ 1..=PROTOCOL_VERSION) => Some(n),
                Some(n) if n > PROTOCOL_VERSION => {
                    return Err(format!(
                        "protocol version {n} is not supported: this tapyard speaks versions 1 to {PROTOCOL_VERSION}"
                    ))
                }
                _ => {
                    return Err(bad(format!(
                        "`version` must be a protocol version (1 to {PROTOCOL_VERSION}), not {n}"
                    )))
                }
            },
        };
        let request = Request::from_value(v).map_err(bad)?;
        Ok(RequestLine { version, request })
    }

    /// The line, without its newline: the request's JSON, then `version` when there is one.
    pub fn encode(&self) -> String {
        // A request always serializes (strings and numbers only) to an object.
        let mut line = serde_json::to_string(&self.request).unwrap_or_default();
        if let Some(v) = self.version {
            if line.ends_with('}') {
                line.pop();
                line.push_str(&format!(",\"version\":{v}}}"));
            }
        }
        line
    }
}

impl From<Request> for RequestLine {
    fn from(request: Request) -> RequestLine {
        RequestLine {
            version: None,
            request,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_bad_ones_are_errors() {
        let cmd = |line: &str| match Request::parse(line) {
            Ok(Request::Command(c)) => c,
            other => panic!("{line}: {other:?}"),
        };
        assert_eq!(
            cmd(r#"{"cmd":"show","what":"fdb"}"#),
            Command::Show {
                what: "fdb".into(),
                json: false
            }
        );
        assert_eq!(cmd(r#"{"cmd":"reload"}"#), Command::Reload {});
        assert_eq!(cmd(r#"{"cmd":"status"}"#), Command::Status {});
        assert_eq!(cmd(r#"{"cmd":"hello"}"#), Command::Hello {});
        assert_eq!(
            cmd(r#"{"cmd":"capture","port":"pod-a","count":3}"#),
            Command::Capture {
                port: "pod-a".into(),
                count: 3
            }
        );
        assert_eq!(
            cmd(r#"{"cmd":"port_add","bridge":"cni0","name":"pod-c","mac":"02:00:00:00:00:0c"}"#),
            Command::PortAdd {
                bridge: "cni0".into(),
                name: "pod-c".into(),
                mac: Some("02:00:00:00:00:0c".into()),
                ips: vec![],
            }
        );
        assert_eq!(
            cmd(r#"{"cmd":"port_add","bridge":"cni0","name":"pod-c","mac":null}"#),
            Command::PortAdd {
                bridge: "cni0".into(),
                name: "pod-c".into(),
                mac: None,
                ips: vec![],
            }
        );
        assert_eq!(
            cmd(
                r#"{"cmd":"port_add","bridge":"cni0","name":"pod-c","ips":["10.244.1.9","fd00::9"]}"#
            ),
            Command::PortAdd {
                bridge: "cni0".into(),
                name: "pod-c".into(),
                mac: None,
                ips: vec!["10.244.1.9".parse().unwrap(), "fd00::9".parse().unwrap()],
            }
        );
        assert_eq!(
            cmd(r#"{"cmd":"port_del","name":"pod-c"}"#),
            Command::PortDel {
                name: "pod-c".into()
            }
        );
        // The plugin's lines, as its crate writes them.
        let add = CniRequest::PortAdd {
            bridge: "cni0".into(),
            owner: "c1/eth0".into(),
            netns: "/var/run/netns/x".into(),
            ifname: "eth0".into(),
            mtu: 1500,
            ips: vec!["10.244.1.9".parse().unwrap()],
        };
        let del = CniRequest::PortDel {
            owner: "c1/eth0".into(),
        };
        let show = CniRequest::PortShow {
            owner: "c1/eth0".into(),
        };
        for r in [add, del, show] {
            let line = serde_json::to_string(&r).unwrap();
            assert_eq!(Request::parse(&line).unwrap(), Request::Cni(r));
        }
        for (bad, field) in [
            (
                r#"{"cmd":"port_add","bridge":"cni0","owner":"c/eth0"}"#,
                "netns",
            ),
            (r#"{"cmd":"port_add","bridge":"cni0"}"#, "name"),
            (
                r#"{"cmd":"port_add","bridge":"cni0","owner":"o","netns":"/n","ifname":"eth0","mtu":-1}"#,
                "-1",
            ),
            (r#"{"cmd":"port_del"}"#, "name"),
            (
                r#"{"cmd":"port_add","name":"x","bridge":"b","color":1}"#,
                "color",
            ),
        ] {
            let e = Request::parse(bad).unwrap_err();
            assert!(
                e.starts_with("bad request") && e.contains(field),
                "{bad}: {e}"
            );
        }
        for bad in [
            "",
            "{",
            "[]",
            r#"{"cmd":"rm"}"#,
            r#"{"cmd":"show"}"#,
            "\u{0}",
        ] {
            assert!(
                Request::parse(bad).unwrap_err().starts_with("bad request"),
                "{bad:?}"
            );
        }
    }

    /// Every command, the CNI plugin's included, refuses a request with a field it does not
    /// have, and the error names the field (`{"cmd":"reload","x":1}` used to reload).
    #[test]
    fn every_command_refuses_an_unknown_field() {
        let good = [
            r#"{"cmd":"show","what":"fdb","json":true}"#,
            r#"{"cmd":"reload"}"#,
            r#"{"cmd":"status"}"#,
            r#"{"cmd":"hello"}"#,
            r#"{"cmd":"capture","port":"pod-a","count":3}"#,
            r#"{"cmd":"port_add","bridge":"cni0","name":"pod-c","mac":"02:00:00:00:00:0c"}"#,
            r#"{"cmd":"port_del","name":"pod-c"}"#,
            r#"{"cmd":"port_add","bridge":"cni0","owner":"c/eth0","netns":"/n","ifname":"eth0","mtu":1500}"#,
            r#"{"cmd":"port_del","owner":"c/eth0"}"#,
            r#"{"cmd":"port_show","owner":"c/eth0"}"#,
        ];
        for line in good {
            Request::parse(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            for extra in ["x", "jsn", "owner_", "Name"] {
                let with = format!("{},\"{extra}\":1}}", line.trim_end_matches('}'));
                let e = Request::parse(&with).expect_err(&with);
                assert!(
                    e.starts_with("bad request") && e.contains(&format!("`{extra}`")),
                    "{with}: {e}"
                );
            }
        }
        // A CNI field on the command's own form is unknown there too.
        let e = Request::parse(r#"{"cmd":"port_add","bridge":"cni0","name":"p","netns":"/n"}"#)
            .unwrap_err();
        assert!(e.contains("`netns`"), "{e}");
    }

    /// `version` is accepted on any request up to [`PROTOCOL_VERSION`], refused above it
    /// (naming both versions) and when it is not a version; it is written last.
    #[test]
    fn versions() {
        for line in [
            r#"{"cmd":"status","version":1}"#,
            r#"{"cmd":"port_del","owner":"c/eth0","version":1}"#,
        ] {
            let l = RequestLine::parse(line).unwrap();
            assert_eq!(l.version, Some(1));
            assert_eq!(l.encode(), line);
        }
        let l = RequestLine::parse(r#"{"cmd":"status"}"#).unwrap();
        assert_eq!(l.version, None);
        assert_eq!(l.encode(), r#"{"cmd":"status"}"#);
        let e = RequestLine::parse(r#"{"cmd":"status","version":2}"#).unwrap_err();
        assert!(
            e.contains("version 2 is not supported") && e.contains("1 to 1"),
            "{e}"
        );
        for bad in ["0", "-1", "\"1\"", "1.5", "null", "4294967297"] {
            let line = format!(r#"{{"cmd":"status","version":{bad}}}"#);
            let e = RequestLine::parse(&line).unwrap_err();
            assert!(e.starts_with("bad request: `version`"), "{line}: {e}");
        }
    }
}
