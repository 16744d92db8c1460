//! The client side of `tapyard`'s commands: finding the socket, and a request's reply
//! through [`tapyard_control::Client`], its failures as the command's messages.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tapyard_control::{Client, ClientError, Command, Connection, Reply};

/// How long a command waits for each read of a reply (a reload may create TAPs and move
/// them; `show conntrack` dumps a full table before its first byte).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Finds the control socket for a client command: `--socket`, else the one named by
/// `--config`, else the only socket in `/run/tapyard`.
pub fn resolve_socket(socket: Option<PathBuf>, config: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(s) = socket {
        return Ok(s);
    }
    if let Some(c) = config {
        let ch = crate::config::load(c);
        return match ch.config {
            Some(cfg) => Ok(cfg.node.socket_path()),
            None => Err(format!(
                "{} is not a valid config (run `tapyard check {}`)",
                c.display(),
                c.display()
            )),
        };
    }
    let dir = Path::new("/run/tapyard");
    let socks: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                .collect()
        })
        .unwrap_or_default();
    match socks.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err("no control socket found in /run/tapyard: is `tapyard run` running? (or give --socket PATH or --config FILE)".into()),
        many => Err(format!(
            "several control sockets in /run/tapyard ({}): pick one with --socket PATH",
            many.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// A failed exchange with the socket at `path`, as the command says it.
fn failed(path: &Path, e: ClientError) -> String {
    let path = path.display();
    match e {
        ClientError::Unreachable(e) => {
            format!("cannot connect to {path}: {e} (is `tapyard run` running?)")
        }
        ClientError::Io { error, .. } => format!("{path}: {error}"),
        ClientError::Garbled { error, line } => format!("{path}: bad reply {line:?}: {error}"),
        ClientError::Refused(msg) => format!("{path}: {msg}"),
    }
}

/// Connects to `path` and sends `cmd`.
fn open(path: &Path, cmd: Command) -> Result<Connection, String> {
    Client::new(path)
        .with_timeout(Some(CLIENT_TIMEOUT))
        .open(&cmd.into())
        .map_err(|e| failed(path, e))
}

/// Sends `cmd` and reads the reply (`ok` or not).
pub fn request<T: DeserializeOwned>(path: &Path, cmd: Command) -> Result<Reply<T>, String> {
    open(path, cmd)?.read_reply().map_err(|e| failed(path, e))
}

/// Sends `cmd` and reads the reply line; returns the stream positioned after it, for what
/// follows (`capture`'s records).
pub fn request_stream(
    path: &Path,
    cmd: Command,
) -> Result<(Reply<()>, BufReader<UnixStream>), String> {
    let mut c = open(path, cmd)?;
    let r = c.read_reply().map_err(|e| failed(path, e))?;
    Ok((r, c.into_reader()))
}

/// As [`request`], for a reply whose `data` may be large (`show conntrack --json` of a full
/// table is ~100 MB): the reply line is parsed field by field and `data` is written to
/// `data_out` row by row as it is parsed, pretty-printed exactly as
/// `serde_json::to_string_pretty` prints it (then a newline), never held as one `Value`.
/// Returns the reply's other fields (`ok`, `text`, `error`, ...), with `data` `true` when
/// there was data.
pub fn request_data(
    path: &Path,
    cmd: Command,
    data_out: &mut dyn Write,
) -> Result<Reply<bool>, String> {
    // Nothing was read yet: the stream is rewrapped with a larger buffer.
    let s = open(path, cmd)?.into_reader().into_inner();
    read_data_reply(&mut BufReader::with_capacity(1 << 20, &s), data_out)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads one reply line from `r` as [`request_data`] does.
pub(super) fn read_data_reply(
    r: &mut impl BufRead,
    data_out: &mut dyn Write,
) -> Result<Reply<bool>, String> {
    let mut raw = Vec::new();
    r.read_until(b'\n', &mut raw).map_err(|e| e.to_string())?;
    let bad = |e: serde_json::Error| format!("bad reply: {e}");
    let mut de = serde_json::Deserializer::from_slice(&raw);
    let rest =
        serde::Deserializer::deserialize_map(&mut de, ReplyFields { data_out }).map_err(bad)?;
    de.end().map_err(bad)?;
    serde_json::from_value(rest).map_err(bad)
}

/// Reads a reply object: `data` goes to the writer as it is parsed, the rest is kept.
struct ReplyFields<'w> {
    data_out: &'w mut dyn Write,
}

impl<'de> serde::de::Visitor<'de> for ReplyFields<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a reply object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut rest = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if k == "data" {
                map.next_value_seed(PrettyData {
                    out: &mut *self.data_out,
                })?;
                rest.insert(k, Value::Bool(true));
            } else {
                let v: Value = map.next_value()?;
                rest.insert(k, v);
            }
        }
        Ok(Value::Object(rest))
    }
}

/// A reply's `data`, pretty-printed to `out` as it is parsed (transcoded token by token,
/// never built as a `Value`), then a newline.
struct PrettyData<'w> {
    out: &'w mut dyn Write,
}

impl<'de> serde::de::DeserializeSeed<'de> for PrettyData<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        use serde::de::Error;
        let mut ser = serde_json::Serializer::pretty(&mut *self.out);
        serde_transcode::transcode(d, &mut ser).map_err(D::Error::custom)?;
        self.out.write_all(b"\n").map_err(D::Error::custom)
    }
}
