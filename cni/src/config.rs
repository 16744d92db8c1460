//! The network configuration read from stdin.
//!
//! Decoding happens in two steps so every error names what is wrong: stdin must be a JSON
//! object (else code 6), its `cniVersion` one this plugin speaks (else code 1), then each field
//! this plugin uses is checked by name (else code 7). Unknown fields are ignored: a conflist
//! entry carries `capabilities`, `runtimeConfig`, `args` and others meant for someone else.

use crate::error::{CniError, DECODE, INCOMPATIBLE_VERSION, INVALID_CONFIG};
use crate::types::{CniResult, Dns};
use serde_json::{Map, Value};

/// The spec versions this plugin reads and writes.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["0.4.0", "1.0.0"];

/// The MTU used when the configuration names none.
pub const DEFAULT_MTU: u32 = 1500;

/// This plugin's network configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// `cniVersion`: one of [`SUPPORTED_VERSIONS`].
    pub cni_version: String,
    /// `name`: the network name.
    pub name: String,
    /// `bridge`: the tapyard bridge the port joins.
    pub bridge: String,
    /// `socket`: the path of the running tapyard's control socket.
    pub socket: String,
    /// `mtu`: of the interface in the container, 68 to 65535 (default 1500).
    pub mtu: u32,
    /// `ipam.type`, when an `ipam` section is present: the IPAM plugin's executable name.
    pub ipam_type: Option<String>,
    /// `dns`, used when the IPAM result has none.
    pub dns: Dns,
    /// `prevResult`: the result of the ADD being checked or deleted (or of the previous plugin).
    pub prev_result: Option<CniResult>,
}

/// Reads `cniVersion` from whatever stdin holds, for tagging an error object. `None` if stdin
/// is not an object with a string `cniVersion`.
pub fn peek_version(stdin: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(stdin).ok()?;
    v.get("cniVersion")?.as_str().map(str::to_string)
}

/// Parses stdin as a JSON object (code 6 otherwise).
pub fn decode_object(stdin: &[u8]) -> Result<Map<String, Value>, CniError> {
    match serde_json::from_slice(stdin) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(CniError::new(
            DECODE,
            "network configuration is not a JSON object",
        )),
        Err(e) => {
            Err(CniError::new(DECODE, "network configuration is not valid JSON").with_details(e))
        }
    }
}

/// Checks `cniVersion` against [`SUPPORTED_VERSIONS`] (code 1 otherwise, code 7 when absent).
pub fn check_version(conf: &Map<String, Value>) -> Result<String, CniError> {
    let version = string_field(conf, "cniVersion")?
        .ok_or_else(|| CniError::new(INVALID_CONFIG, "cniVersion is missing"))?;
    if !SUPPORTED_VERSIONS.contains(&version.as_str()) {
        return Err(CniError::new(
            INCOMPATIBLE_VERSION,
            format!("incompatible CNI version {version:?}"),
        )
        .with_details(format!(
            "supported versions: {}",
            SUPPORTED_VERSIONS.join(", ")
        )));
    }
    Ok(version)
}

impl NetConf {
    /// Decodes and checks stdin.
    pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
        let conf = decode_object(stdin)?;
        let cni_version = check_version(&conf)?;
        let required = |field: &str| {
            string_field(&conf, field)?
                .filter(|s| !s.is_empty())
                .ok_or_else(|| CniError::new(INVALID_CONFIG, format!("{field} is missing")))
        };
        let name = required("name")?;
        let bridge = required("bridge")?;
        let socket = required("socket")?;
        let mtu = match conf.get("mtu") {
            None | Some(Value::Null) => DEFAULT_MTU,
            Some(v) => v
                .as_u64()
                .filter(|m| (68..=65535).contains(m))
                .and_then(|m| u32::try_from(m).ok())
                .ok_or_else(|| {
                    CniError::new(
                        INVALID_CONFIG,
                        format!("mtu {v} is not an integer from 68 to 65535"),
                    )
                })?,
        };
        let ipam_type = match conf.get("ipam") {
            None | Some(Value::Null) => None,
            Some(Value::Object(ipam)) => {
                let t = string_field(ipam, "type")?
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| CniError::new(INVALID_CONFIG, "ipam.type is missing"))?;
                if t.contains('/') || t == "." || t == ".." {
                    return Err(CniError::new(
                        INVALID_CONFIG,
                        format!("ipam.type {t:?} is not a plugin name"),
                    ));
                }
                Some(t)
            }
            Some(_) => return Err(CniError::new(INVALID_CONFIG, "ipam is not an object")),
        };
        let dns = typed_field(&conf, "dns")?.unwrap_or_default();
        let prev_result = typed_field(&conf, "prevResult")?;
        Ok(NetConf {
            cni_version,
            name,
            bridge,
            socket,
            mtu,
            ipam_type,
            dns,
            prev_result,
        })
    }
}

/// A string field: `Ok(None)` when absent or null, code 7 when of another type.
fn string_field(conf: &Map<String, Value>, field: &str) -> Result<Option<String>, CniError> {
    match conf.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(CniError::new(
            INVALID_CONFIG,
            format!("{field} is not a string: {v}"),
        )),
    }
}

/// A structured field: `Ok(None)` when absent or null, code 7 naming the field when malformed.
fn typed_field<T: serde::de::DeserializeOwned>(
    conf: &Map<String, Value>,
    field: &str,
) -> Result<Option<T>, CniError> {
    match conf.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v).map(Some).map_err(|e| {
            CniError::new(INVALID_CONFIG, format!("{field} is malformed")).with_details(e)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::*;

    const GOOD: &str = r#"{ "cniVersion": "1.0.0", "name": "tapyard", "type": "tapyard-cni",
        "bridge": "cni0", "socket": "/run/tapyard/node-a.sock", "mtu": 1500,
        "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.244.1.0/24",
        "gateway": "10.244.1.1" }]], "routes": [{ "dst": "0.0.0.0/0" }] } }"#;

    fn with(edit: impl FnOnce(&mut Map<String, Value>)) -> Result<NetConf, CniError> {
        let mut m: Map<String, Value> = serde_json::from_str(GOOD).unwrap();
        edit(&mut m);
        NetConf::parse(serde_json::to_string(&m).unwrap().as_bytes())
    }

    #[test]
    fn the_documented_config_parses() {
        let c = NetConf::parse(GOOD.as_bytes()).unwrap();
        assert_eq!((c.bridge.as_str(), c.mtu), ("cni0", 1500));
        assert_eq!(c.ipam_type.as_deref(), Some("host-local"));
        assert_eq!(with(|m| drop(m.remove("mtu"))).unwrap().mtu, DEFAULT_MTU);
    }

    #[test]
    fn each_error_has_its_code_and_names_the_field() {
        assert_eq!(NetConf::parse(b"{nope").unwrap_err().code, DECODE);
        assert_eq!(NetConf::parse(b"[1]").unwrap_err().code, DECODE);
        let e = with(|m| drop(m.insert("cniVersion".into(), "0.3.1".into()))).unwrap_err();
        assert_eq!(e.code, INCOMPATIBLE_VERSION);
        for (field, value) in [
            ("bridge", Value::Null),
            ("socket", Value::from("")),
            ("mtu", Value::from(9)),
            ("mtu", Value::from("1500")),
            ("ipam", Value::from(3)),
            ("prevResult", Value::from("x")),
        ] {
            let e = with(|m| drop(m.insert(field.into(), value.clone()))).unwrap_err();
            assert_eq!(e.code, INVALID_CONFIG, "{field}={value}");
            assert!(e.msg.contains(field), "{e}");
        }
        let e = with(|m| {
            drop(
                m["ipam"]
                    .as_object_mut()
                    .unwrap()
                    .insert("type".into(), "../x".into()),
            )
        });
        assert_eq!(e.unwrap_err().code, INVALID_CONFIG);
    }
}
