//! The reply envelope and the data of the replies that are not tables.

use std::io::{self, Write};

use serde::{Deserialize, Serialize};

/// A reply line: `{"ok":true,"data":...}`, `{"ok":true,"text":"..."}` or
/// `{"ok":false,"error":"..."}`, with the fields some replies add (`reload`'s `changes` and
/// `errors`, `capture`'s `port` and `linktype`).
///
/// A field that is `None` is not written (none is ever `null`), and the fields are written
/// in alphabetical order, as the replies were when they were built as `serde_json::Value`
/// maps: the lines are byte for byte what they were. A reader ignores fields it does not
/// know (a newer server may add some).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply<T> {
    /// `reload`: the changes applied (also when some were refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<Vec<String>>,
    /// The answer when `ok` (a missing field reads as `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
    /// What went wrong when not `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `reload`: each change refused (by the library) or each error of the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<String>>,
    /// `capture`'s header: the frames' link type (`ethernet`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linktype: Option<String>,
    /// Whether the request succeeded.
    pub ok: bool,
    /// `capture`'s header: the port captured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// The answer as text (a table without `json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl<T> Default for Reply<T> {
    fn default() -> Self {
        Reply {
            changes: None,
            data: None,
            error: None,
            errors: None,
            linktype: None,
            ok: false,
            port: None,
            text: None,
        }
    }
}

impl<T> Reply<T> {
    /// `{"ok":true,"data":data}`.
    pub fn data(data: T) -> Self {
        Reply {
            ok: true,
            data: Some(data),
            ..Reply::default()
        }
    }

    /// `{"ok":true,"text":text}`.
    pub fn text(text: String) -> Self {
        Reply {
            ok: true,
            text: Some(text),
            ..Reply::default()
        }
    }

    /// `{"ok":false,"error":error}`.
    pub fn error(error: impl Into<String>) -> Self {
        Reply {
            error: Some(error.into()),
            ..Reply::default()
        }
    }

    /// The data, or the error.
    pub fn from_result(r: Result<T, String>) -> Self {
        match r {
            Ok(data) => Reply::data(data),
            Err(e) => Reply::error(e),
        }
    }

    /// The same reply with data of another type (e.g. `Reply<()>` for one that has none).
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Reply<U> {
        Reply {
            changes: self.changes,
            data: self.data.map(f),
            error: self.error,
            errors: self.errors,
            linktype: self.linktype,
            ok: self.ok,
            port: self.port,
            text: self.text,
        }
    }

    /// The error message with each of `errors` on a line of its own below it, as a client
    /// prints a refusal (`request failed` when the reply has no `error`).
    pub fn error_message(&self) -> String {
        let mut msg = self
            .error
            .clone()
            .unwrap_or_else(|| "request failed".to_string());
        for e in self.errors.iter().flatten() {
            msg.push_str(&format!("\n  {e}"));
        }
        msg
    }
}

impl<T: Serialize> Reply<T> {
    /// The line, with its newline.
    pub fn line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_else(|e| {
            // Only a map with non-string keys fails, which no reply has.
            serde_json::to_string(&Reply::<()>::error(e.to_string())).unwrap_or_default()
        });
        line.push('\n');
        line
    }
}

/// A reply whose `data` is an array written row by row as the rows are read (the
/// conntrack table, ~100 MB of JSON when full, is never held as one value):
/// `{"ok":true,"data":[ROW,...]}` then a newline. Unlike [`Reply`]'s, this line has `ok`
/// first (as it always had); a reader sees the same reply.
#[derive(Debug)]
pub struct RowStream<W: Write> {
    out: W,
    rows: u64,
}

impl<W: Write> RowStream<W> {
    /// Writes the start of the reply.
    pub fn begin(mut out: W) -> io::Result<Self> {
        out.write_all(br#"{"ok":true,"data":["#)?;
        Ok(RowStream { out, rows: 0 })
    }

    /// Writes one row.
    pub fn row<R: Serialize + ?Sized>(&mut self, row: &R) -> io::Result<()> {
        if self.rows > 0 {
            self.out.write_all(b",")?;
        }
        serde_json::to_writer(&mut self.out, row)?;
        self.rows += 1;
        Ok(())
    }

    /// Writes the end of the line, flushes, and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(b"]}\n")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// The data of `hello`: the server's protocol version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The highest protocol version it speaks ([`crate::PROTOCOL_VERSION`] of its build).
    pub protocol: u32,
    /// The server's name and version, e.g. `tapyard 0.1.0`.
    pub software: String,
}

/// A port as tapyard describes it: the data of `port_add` (both forms) and `port_show`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    /// The bridge it is attached to.
    pub bridge: String,
    /// Its ifindex where it lives.
    pub ifindex: u32,
    /// Its MAC address, `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// The interface name (inside the namespace for a CNI port).
    pub name: String,
    /// The namespace it lives in (empty while it is in tapyard's).
    pub netns: String,
}

/// The data of `port_del` (both forms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortDeleted {
    /// `false` when there was no such port (not an error).
    pub removed: bool,
}

/// The data of `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The config file's path.
    pub config: String,
    /// The router interfaces.
    pub interfaces: Vec<StatusInterface>,
    /// The node-level NAT settings (`[node]` keys); all defaults from a server without them.
    #[serde(default)]
    pub nat: StatusNat,
    /// The node's name.
    pub node: String,
    /// Every port.
    pub ports: Vec<StatusPort>,
    /// The number of datapath workers.
    pub workers: u64,
}

/// The node-level NAT settings in [`Status`], as `[node]` sets them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusNat {
    /// `masquerade_all`: every new connection to a ClusterIP is masqueraded.
    pub masquerade_all: bool,
    /// `node_port_addresses`: the prefixes NodePorts answer in (empty: every node address).
    pub node_port_addresses: Vec<String>,
    /// `random_fully`: masqueraded source ports are chosen at random.
    pub random_fully: bool,
}

/// A router interface in [`Status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusInterface {
    /// Its IPv4 address and prefix length (`null`: none).
    pub address: Option<String>,
    /// Its IPv6 address and prefix length (`null`: none).
    pub address6: Option<String>,
    /// Its IPv6 link-local address (`null`: none).
    pub link_local6: Option<String>,
    /// Its MAC address.
    pub mac: String,
    /// Its name.
    pub name: String,
}

/// A port in [`Status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusPort {
    /// The port's name.
    pub name: String,
    /// Its TAP's name in tapyard's namespace.
    pub tap: String,
}
