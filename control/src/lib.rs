#![doc = include_str!("../PROTOCOL.md")]
//!
//! # This crate
//! [`Request`] (the node's own [`Command`]s and the CNI plugin's [`CniRequest`]s, with
//! [`RequestLine`] for the optional `version`), the reply envelope [`Reply`], each reply's
//! typed data ([`show`] for the tables, [`Status`], [`Hello`], [`PortInfo`],
//! [`PortDeleted`]), [`RowStream`] for a reply whose rows are written as they are read, and
//! [`Client`]. The server is `cli/src/control/`; the clients are `tapyard`
//! (`cli/src/commands/client.rs`) and `tapyard-cni` (`cni/src/control.rs`). Its only dependencies are serde and serde_json.

mod client;
mod reply;
mod request;
pub mod show;

pub use client::{Client, ClientError, Connection, REPLY_TIMEOUT};
pub use reply::{
    Hello, PortDeleted, PortInfo, Reply, RowStream, Status, StatusInterface, StatusNat, StatusPort,
};
pub use request::{CniRequest, Command, Request, RequestLine};

/// The protocol version this crate speaks: what [`Hello`] reports and the highest `version` a
/// request may carry. Version 1 is the protocol as it was before it had a number; a request
/// without `version` is a version 1 request.
pub const PROTOCOL_VERSION: u32 = 1;

/// The longest request line a server accepts.
pub const MAX_REQUEST: u64 = 64 * 1024;
