//! The client of tapyard's control socket, and the messages both sides exchange.
//!
//! # Protocol
//! A Unix stream socket; the client writes one JSON request terminated by `\n`, the server
//! answers with one JSON reply line and may close the connection. One request per connection.
//!
//! ```text
//! {"cmd":"port_add","bridge":"cni0","owner":"<CNI_CONTAINERID>/<CNI_IFNAME>","netns":"<CNI_NETNS>","ifname":"eth0","mtu":1500}
//!    -> {"ok":true,"data":{"name":"eth0","ifindex":7,"mac":"02:..","bridge":"cni0","netns":"/var/run/netns/x"}}
//!    -> {"ok":false,"error":"port eth0 exists in ..."}
//! {"cmd":"port_del","owner":"<CNI_CONTAINERID>/<CNI_IFNAME>"}
//!    -> {"ok":true,"data":{"removed":true}}      ("removed":false if there was no such port)
//! {"cmd":"port_show","owner":"<CNI_CONTAINERID>/<CNI_IFNAME>"}
//!    -> {"ok":true,"data":{"name":"eth0","ifindex":7,"mac":"..","bridge":"cni0","netns":".."}}
//!    -> {"ok":false,"error":"no such port"}
//! ```
//!
//! `port_add` asks tapyard to create a TAP it serves on `bridge`, move it into `netns` and
//! rename it `ifname` there; the plugin then configures addresses and routes itself. The owner
//! key makes `port_del` work from nothing but the `CNI_*` variables. The server side (in
//! `cli/`) mirrors [`Request`], [`Reply`], [`PortInfo`] and [`PortDeleted`].

use crate::error::{CniError, TAPYARD_REFUSED, TRY_AGAIN_LATER};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the client waits for a reply before giving up with code 11.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A request line, tagged by `cmd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
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

/// A reply line: `{"ok":true,"data":...}` or `{"ok":false,"error":"..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply<T> {
    /// Whether the request succeeded.
    pub ok: bool,
    /// The answer when `ok` (a missing field reads as `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
    /// What went wrong when not `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A port as tapyard describes it: the data of `port_add` and `port_show`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    /// The interface name inside the namespace.
    pub name: String,
    /// Its ifindex inside the namespace.
    pub ifindex: u32,
    /// Its MAC address, `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// The bridge it is attached to.
    pub bridge: String,
    /// The namespace it lives in.
    pub netns: String,
}

/// The data of `port_del`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortDeleted {
    /// `false` when there was no such port (not an error).
    pub removed: bool,
}

/// How a request failed.
#[derive(Debug)]
pub enum ControlError {
    /// The socket cannot be reached: tapyard is not running (or not yet).
    Unreachable(CniError),
    /// tapyard answered `ok:false` with this message.
    Refused(String),
    /// The exchange broke after connecting (timeout, garbled reply): it is unknown whether the
    /// request took effect.
    Broken(CniError),
}

impl From<ControlError> for CniError {
    fn from(e: ControlError) -> CniError {
        match e {
            ControlError::Unreachable(e) | ControlError::Broken(e) => e,
            ControlError::Refused(msg) => CniError::new(TAPYARD_REFUSED, format!("tapyard: {msg}")),
        }
    }
}

/// A client of one tapyard control socket.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
}

impl Client {
    /// A client of the socket at `path` (nothing is opened yet).
    pub fn new(path: impl Into<PathBuf>) -> Client {
        Client { path: path.into() }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends `request` and reads the reply's data.
    pub fn call<T: DeserializeOwned>(&self, request: &Request) -> Result<T, ControlError> {
        let path = self.path.display();
        let mut stream = UnixStream::connect(&self.path).map_err(|e| {
            ControlError::Unreachable(
                CniError::new(
                    TRY_AGAIN_LATER,
                    format!("tapyard control socket {path} is not reachable"),
                )
                .with_details(e),
            )
        })?;
        let broken = |what: &str, e: &dyn std::fmt::Display| {
            ControlError::Broken(
                CniError::new(
                    TRY_AGAIN_LATER,
                    format!("tapyard control socket {path}: {what}"),
                )
                .with_details(e),
            )
        };
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(REPLY_TIMEOUT)))
            .map_err(|e| broken("cannot set timeouts", &e))?;
        let mut line = serde_json::to_vec(request).map_err(|e| broken("cannot encode", &e))?;
        line.push(b'\n');
        stream
            .write_all(&line)
            .map_err(|e| broken("cannot send request", &e))?;
        let mut reply = String::new();
        BufReader::new(&stream)
            .read_line(&mut reply)
            .map_err(|e| broken("no reply", &e))?;
        let garbled = |e: &dyn std::fmt::Display| {
            ControlError::Broken(
                CniError::new(
                    TAPYARD_REFUSED,
                    format!("tapyard control socket {path}: unreadable reply"),
                )
                .with_details(format!("{e}: {}", reply.trim())),
            )
        };
        let reply: Reply<T> = serde_json::from_str(&reply).map_err(|e| garbled(&e))?;
        match reply {
            Reply {
                ok: true,
                data: Some(data),
                ..
            } => Ok(data),
            Reply {
                ok: true,
                data: None,
                ..
            } => Err(garbled(&"ok without data")),
            Reply {
                ok: false, error, ..
            } => Err(ControlError::Refused(
                error.unwrap_or_else(|| "unspecified error".into()),
            )),
        }
    }

    /// `port_add`.
    pub fn port_add(
        &self,
        bridge: &str,
        owner: &str,
        netns: &str,
        ifname: &str,
        mtu: u32,
    ) -> Result<PortInfo, ControlError> {
        self.call(&Request::PortAdd {
            bridge: bridge.into(),
            owner: owner.into(),
            netns: netns.into(),
            ifname: ifname.into(),
            mtu,
        })
    }

    /// `port_del`: whether a port was removed.
    pub fn port_del(&self, owner: &str) -> Result<bool, ControlError> {
        self.call::<PortDeleted>(&Request::PortDel {
            owner: owner.into(),
        })
        .map(|d| d.removed)
    }

    /// `port_show`.
    pub fn port_show(&self, owner: &str) -> Result<PortInfo, ControlError> {
        self.call(&Request::PortShow {
            owner: owner.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_the_documented_lines() {
        let add = Request::PortAdd {
            bridge: "cni0".into(),
            owner: "c1/eth0".into(),
            netns: "/var/run/netns/x".into(),
            ifname: "eth0".into(),
            mtu: 1500,
        };
        assert_eq!(
            serde_json::to_string(&add).unwrap(),
            r#"{"cmd":"port_add","bridge":"cni0","owner":"c1/eth0","netns":"/var/run/netns/x","ifname":"eth0","mtu":1500}"#
        );
        let del = Request::PortDel {
            owner: "c1/eth0".into(),
        };
        assert_eq!(
            serde_json::to_string(&del).unwrap(),
            r#"{"cmd":"port_del","owner":"c1/eth0"}"#
        );
        let r: Reply<PortDeleted> = serde_json::from_str(r#"{"ok":false,"error":"x"}"#).unwrap();
        assert_eq!(r.error.as_deref(), Some("x"));
    }

    #[test]
    fn a_missing_socket_is_try_again_later() {
        let e = Client::new("/nonexistent/tapyard.sock")
            .port_del("c/eth0")
            .unwrap_err();
        let e = CniError::from(e);
        assert_eq!(e.code, TRY_AGAIN_LATER);
        assert!(e.msg.contains("/nonexistent/tapyard.sock"));
    }
}
