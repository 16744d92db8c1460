//! The client of tapyard's control socket, and the messages both sides exchange.
//!
//! The protocol, its types and the client are the `tapyard-control` crate's (see its
//! PROTOCOL.md); this module re-exports the plugin's part ([`Request`] is
//! [`tapyard_control::CniRequest`]) and maps the client's failures to CNI errors:
//!
//! ```text
//! {"cmd":"port_add","bridge":"cni0","owner":"<CNI_CONTAINERID>/<CNI_IFNAME>","netns":"<CNI_NETNS>","ifname":"eth0","mtu":1500,"ips":["10.244.1.5"]}
//!    -> {"data":{"bridge":"cni0","ifindex":7,"mac":"02:..","name":"eth0","netns":"/var/run/netns/x"},"ok":true}
//!    -> {"error":"port eth0 exists in ...","ok":false}
//! {"cmd":"port_del","owner":"<CNI_CONTAINERID>/<CNI_IFNAME>"}
//!    -> {"data":{"removed":true},"ok":true}      ("removed":false if there was no such port)
//! {"cmd":"port_show","owner":"<CNI_CONTAINERID>/<CNI_IFNAME>"}
//!    -> {"data":{"bridge":"cni0","ifindex":7,"mac":"..","name":"eth0","netns":".."},"ok":true}
//!    -> {"error":"no such port","ok":false}
//! ```

use crate::error::{CniError, TAPYARD_REFUSED, TRY_AGAIN_LATER};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tapyard_control::ClientError;
pub use tapyard_control::{CniRequest as Request, PortDeleted, PortInfo, Reply};

/// How long the client waits for a reply before giving up with code 11.
pub const REPLY_TIMEOUT: Duration = tapyard_control::REPLY_TIMEOUT;

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

/// A client of one tapyard control socket ([`tapyard_control::Client`], its failures as
/// CNI errors).
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
    pub fn call<T: serde::de::DeserializeOwned>(
        &self,
        request: &Request,
    ) -> Result<T, ControlError> {
        let path = self.path.display();
        let client = tapyard_control::Client::new(&self.path).with_timeout(Some(REPLY_TIMEOUT));
        client
            .call_data(&request.clone().into())
            .map_err(|e| match e {
                ClientError::Unreachable(e) => ControlError::Unreachable(
                    CniError::new(
                        TRY_AGAIN_LATER,
                        format!("tapyard control socket {path} is not reachable"),
                    )
                    .with_details(e),
                ),
                ClientError::Io { what, error } => ControlError::Broken(
                    CniError::new(
                        TRY_AGAIN_LATER,
                        format!("tapyard control socket {path}: {what}"),
                    )
                    .with_details(error),
                ),
                ClientError::Garbled { error, line } => ControlError::Broken(
                    CniError::new(
                        TAPYARD_REFUSED,
                        format!("tapyard control socket {path}: unreadable reply"),
                    )
                    .with_details(format!("{error}: {line}")),
                ),
                ClientError::Refused(msg) => ControlError::Refused(msg),
            })
    }

    /// `port_add`.
    pub fn port_add(
        &self,
        bridge: &str,
        owner: &str,
        netns: &str,
        ifname: &str,
        mtu: u32,
        ips: Vec<std::net::IpAddr>,
    ) -> Result<PortInfo, ControlError> {
        self.call(&Request::PortAdd {
            bridge: bridge.into(),
            owner: owner.into(),
            netns: netns.into(),
            ifname: ifname.into(),
            mtu,
            ips,
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
            ips: vec![
                "10.244.1.2".parse().unwrap(),
                "fd00:10:244:1::2".parse().unwrap(),
            ],
        };
        assert_eq!(
            serde_json::to_string(&add).unwrap(),
            r#"{"cmd":"port_add","bridge":"cni0","owner":"c1/eth0","netns":"/var/run/netns/x","ifname":"eth0","mtu":1500,"ips":["10.244.1.2","fd00:10:244:1::2"]}"#
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
