//! The `CNI_*` environment variables, read and checked once.
//!
//! Which variables a command needs follows the spec: ADD and CHECK need `CNI_CONTAINERID`,
//! `CNI_NETNS` and `CNI_IFNAME`; DEL needs `CNI_CONTAINERID` and `CNI_IFNAME` (the runtime may
//! have lost the namespace already); VERSION needs only `CNI_COMMAND`. A missing or malformed
//! one is error code 4.

use crate::error::{CniError, INVALID_ENV};
use std::path::PathBuf;

/// The operation the runtime asked for (`CNI_COMMAND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Attach the container to the network.
    Add,
    /// Detach it; idempotent.
    Del,
    /// Verify that the attachment is still as ADD left it.
    Check,
    /// Report the spec versions this plugin supports.
    Version,
}

impl Command {
    /// The name the spec uses (`"ADD"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
        }
    }
}

/// The checked `CNI_*` variables of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniArgs {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID`; empty for VERSION.
    pub container_id: String,
    /// `CNI_NETNS`: the path of the container's network namespace; `None` for VERSION and when
    /// DEL was called without one.
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME`: the interface name inside the container; empty for VERSION.
    pub ifname: String,
    /// `CNI_PATH`, split on `:`: where to look for the IPAM plugin.
    pub path: Vec<PathBuf>,
    /// `CNI_ARGS` as `key=value` pairs; this plugin knows none of the keys and ignores them.
    pub extra: Vec<(String, String)>,
}

impl CniArgs {
    /// Reads and checks the variables through `get` (`std::env::var` in the binary).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<CniArgs, CniError> {
        let var = |name: &str| get(name).filter(|v| !v.is_empty());
        let required = |name: &str| {
            var(name).ok_or_else(|| CniError::new(INVALID_ENV, format!("{name} is not set")))
        };
        let command = match required("CNI_COMMAND")?.as_str() {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            other => {
                return Err(CniError::new(
                    INVALID_ENV,
                    format!("unknown CNI_COMMAND {other:?}"),
                ))
            }
        };
        let path = var("CNI_PATH")
            .map(|p| {
                p.split(':')
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        if command == Command::Version {
            return Ok(CniArgs {
                command,
                container_id: String::new(),
                netns: None,
                ifname: String::new(),
                path,
                extra: Vec::new(),
            });
        }
        let container_id = required("CNI_CONTAINERID")?;
        let ifname = required("CNI_IFNAME")?;
        check_ifname(&ifname)?;
        let netns = match command {
            Command::Del => var("CNI_NETNS"),
            _ => Some(required("CNI_NETNS")?),
        }
        .map(PathBuf::from);
        let extra = parse_cni_args(&var("CNI_ARGS").unwrap_or_default())?;
        Ok(CniArgs {
            command,
            container_id,
            netns,
            ifname,
            path,
            extra,
        })
    }

    /// The owner key tapyard files the port under: `<CNI_CONTAINERID>/<CNI_IFNAME>`.
    pub fn owner(&self) -> String {
        format!("{}/{}", self.container_id, self.ifname)
    }
}

/// Linux interface names: 1 to 15 bytes, no `/`, no whitespace, not `.` or `..`.
fn check_ifname(name: &str) -> Result<(), CniError> {
    let bad = name.len() > 15
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace());
    if bad {
        return Err(CniError::new(
            INVALID_ENV,
            format!("CNI_IFNAME {name:?} is not a valid interface name"),
        ));
    }
    Ok(())
}

/// `K8S_POD_NAME=x;IgnoreUnknown=1` into pairs; a pair without `=` is an error.
fn parse_cni_args(s: &str) -> Result<Vec<(String, String)>, CniError> {
    s.split(';')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| {
                    CniError::new(INVALID_ENV, format!("CNI_ARGS: {pair:?} is not key=value"))
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<CniArgs, CniError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CniArgs::parse(|k| map.get(k).cloned())
    }

    const ADD: [(&str, &str); 5] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    #[test]
    fn add_needs_its_variables() {
        let a = parse(&ADD).unwrap();
        assert_eq!(a.owner(), "c1/eth0");
        assert_eq!(a.path.len(), 2);
        for skip in ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
            let vars: Vec<_> = ADD.iter().copied().filter(|(k, _)| *k != skip).collect();
            let e = parse(&vars).unwrap_err();
            assert_eq!(e.code, INVALID_ENV);
            assert!(e.msg.contains(skip), "{e}");
        }
    }

    #[test]
    fn del_without_netns_and_version_alone() {
        let mut vars: Vec<_> = ADD
            .iter()
            .copied()
            .filter(|(k, _)| *k != "CNI_NETNS")
            .collect();
        vars[0] = ("CNI_COMMAND", "DEL");
        assert_eq!(parse(&vars).unwrap().netns, None);
        assert_eq!(
            parse(&[("CNI_COMMAND", "VERSION")]).unwrap().command,
            Command::Version
        );
        assert_eq!(
            parse(&[("CNI_COMMAND", "FROB")]).unwrap_err().code,
            INVALID_ENV
        );
    }

    #[test]
    fn cni_args_and_ifname() {
        let mut vars = ADD.to_vec();
        vars.push(("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web"));
        assert_eq!(parse(&vars).unwrap().extra.len(), 2);
        vars.pop();
        vars.push(("CNI_ARGS", "junk"));
        assert_eq!(parse(&vars).unwrap_err().code, INVALID_ENV);
        vars.pop();
        vars[3] = ("CNI_IFNAME", "a-name-that-is-too-long");
        assert_eq!(parse(&vars).unwrap_err().code, INVALID_ENV);
    }
}
