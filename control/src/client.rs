//! A client of the control socket: one request per connection.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::{Command, Hello, Reply, Request, RequestLine};

/// How long a client waits, by default, for each read of the reply and each write of the
/// request.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// How a request failed.
#[derive(Debug)]
pub enum ClientError {
    /// The socket cannot be reached: tapyard is not running (or not yet). The request was
    /// not sent.
    Unreachable(io::Error),
    /// The exchange broke after connecting (`what` failed: `cannot set timeouts`, `cannot
    /// send request`, `no reply`): it is unknown whether the request took effect.
    Io {
        /// What failed.
        what: &'static str,
        /// How.
        error: io::Error,
    },
    /// The reply line is not a reply (or, for [`Client::call_data`], `ok` without `data`).
    Garbled {
        /// What is wrong with it.
        error: String,
        /// The line (without its newline).
        line: String,
    },
    /// [`Client::call_data`]: the server answered `ok:false`, with this message (and each of
    /// `errors` on a line below it).
    Refused(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Unreachable(e) => write!(f, "cannot connect: {e}"),
            ClientError::Io { what, error } => write!(f, "{what}: {error}"),
            ClientError::Garbled { error, line } => write!(f, "bad reply {line:?}: {error}"),
            ClientError::Refused(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for ClientError {}

/// A client of one control socket.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
    timeout: Option<Duration>,
    version: Option<u32>,
}

impl Client {
    /// A client of the socket at `path` (nothing is opened yet), with [`REPLY_TIMEOUT`] and
    /// no `version` in its requests.
    pub fn new(path: impl Into<PathBuf>) -> Client {
        Client {
            path: path.into(),
            timeout: Some(REPLY_TIMEOUT),
            version: None,
        }
    }

    /// The same client with another timeout for each read and write (`None`: none).
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Client {
        self.timeout = timeout;
        self
    }

    /// The same client sending `"version": version` in every request (the server refuses a
    /// version it does not speak; see [`RequestLine`]).
    pub fn with_version(mut self, version: u32) -> Client {
        self.version = Some(version);
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Connects and sends `request`; the reply is read from the [`Connection`].
    pub fn open(&self, request: &Request) -> Result<Connection, ClientError> {
        let stream = UnixStream::connect(&self.path).map_err(ClientError::Unreachable)?;
        let io = |what| move |error| ClientError::Io { what, error };
        stream
            .set_read_timeout(self.timeout)
            .and_then(|()| stream.set_write_timeout(self.timeout))
            .map_err(io("cannot set timeouts"))?;
        let mut line = RequestLine {
            version: self.version,
            request: request.clone(),
        }
        .encode();
        line.push('\n');
        (&stream)
            .write_all(line.as_bytes())
            .map_err(io("cannot send request"))?;
        Ok(Connection {
            reader: BufReader::new(stream),
        })
    }

    /// Sends `request` and reads the reply line (`ok` or not).
    pub fn call<T: DeserializeOwned>(&self, request: &Request) -> Result<Reply<T>, ClientError> {
        self.open(request)?.read_reply()
    }

    /// Sends `request` and reads the reply's data: `ok:false` is [`ClientError::Refused`].
    pub fn call_data<T: DeserializeOwned>(&self, request: &Request) -> Result<T, ClientError> {
        let mut c = self.open(request)?;
        let (reply, line) = c.read_reply_line::<T>()?;
        match reply {
            Reply {
                ok: true,
                data: Some(data),
                ..
            } => Ok(data),
            Reply { ok: true, .. } => Err(ClientError::Garbled {
                error: "ok without data".into(),
                line,
            }),
            r => Err(ClientError::Refused(r.error_message())),
        }
    }

    /// `hello`: the protocol version the server speaks. A server that predates the versioning
    /// refuses the command; that reads as version 1.
    pub fn hello(&self) -> Result<Hello, ClientError> {
        let reply: Reply<Hello> = self.call(&Command::Hello {}.into())?;
        match reply {
            Reply {
                ok: true,
                data: Some(h),
                ..
            } => Ok(h),
            Reply {
                ok: false,
                error: Some(e),
                ..
            } if e.contains("unknown variant `hello`") => Ok(Hello {
                protocol: 1,
                software: "tapyard".into(),
            }),
            r => Err(ClientError::Refused(r.error_message())),
        }
    }
}

/// A connection after its request was sent.
#[derive(Debug)]
pub struct Connection {
    reader: BufReader<UnixStream>,
}

impl Connection {
    /// Reads the reply line.
    pub fn read_reply<T: DeserializeOwned>(&mut self) -> Result<Reply<T>, ClientError> {
        self.read_reply_line().map(|(r, _)| r)
    }

    fn read_reply_line<T: DeserializeOwned>(&mut self) -> Result<(Reply<T>, String), ClientError> {
        let mut line = String::new();
        self.reader
            .read_line(&mut line)
            .map_err(|error| ClientError::Io {
                what: "no reply",
                error,
            })?;
        match serde_json::from_str(&line) {
            Ok(r) => Ok((r, line)),
            Err(e) => Err(ClientError::Garbled {
                error: e.to_string(),
                line: line.trim().to_string(),
            }),
        }
    }

    /// The stream, positioned where the reader is (after the reply line once it was read),
    /// for what follows the reply (`capture`'s records) or to read it otherwise.
    pub fn into_reader(self) -> BufReader<UnixStream> {
        self.reader
    }
}
