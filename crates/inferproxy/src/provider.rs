//! One inference, whatever the provider: the slot, the deadline, the retries, the stream.
//!
//! The HTTP providers share everything but their wire format: one deadline for the whole
//! request (connect, retries, waits and every byte of the stream; the HTTP client is given only
//! the time that is left, so a provider that trickles bytes cannot hold a request past it),
//! retries on 429, 5xx and failed connections with backoff or the provider's `Retry-After`, only
//! before the first byte is forwarded, and every failure an [`InferError`].

use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bxcore::runbook::Anchored;
use bxcore::{InferReply, InferRequest};
use ureq::http::HeaderValue;
use ureq::tls::{Certificate, RootCerts, TlsConfig};

use crate::anthropic;
use crate::config::{Config, Endpoint, Limits, MaxTokensKey, ProviderKind, Slot};
use crate::error::InferError;
use crate::key::ApiKey;
use crate::openai;
use crate::reply::Draft;
use crate::resolve::Pinned;
use crate::retry;
use crate::script::Script;
use crate::sse;
use crate::stream::{Failure, Flow, MAX_REPLY, StreamParser};

/// The most bytes of an error response that are read for its message.
const MAX_ERROR_BODY: u64 = 64 * 1024;

/// How long a probe of the provider may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Who answers.
#[derive(Debug)]
pub enum Provider {
    Script(Script),
    Http(Http),
}

/// An OpenAI-compatible or Anthropic endpoint, its key and its HTTP client.
pub struct Http {
    kind: ProviderKind,
    max_tokens_key: MaxTokensKey,
    endpoint: Endpoint,
    key: ApiKey,
    /// Where the key was read from (for `check` and the startup notice; never the key).
    key_source: std::path::PathBuf,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http")
            .field("kind", &self.kind)
            .field("endpoint", &self.endpoint)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Why the provider could not be set up at start (the configuration loaded; a file it names
/// did not).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Key(crate::key::KeyError),
    #[error(transparent)]
    Script(crate::script::ScriptError),
    /// The endpoint, or no system CA bundle for an https one: what is wrong.
    #[error("{0}")]
    Ca(String),
    /// The CA bundle: its path and what is wrong.
    #[error(transparent)]
    Bundle(#[from] bxtls::CaError),
}

impl Anchored for SetupError {
    fn anchor(&self) -> &str {
        match self {
            SetupError::Key(e) => e.anchor(),
            SetupError::Script(e) => e.anchor(),
            SetupError::Ca(_) | SetupError::Bundle(_) => crate::config::CONFIG_ANCHOR,
        }
    }
}

/// Load the trusted CA certificates from `ca_file`, or the first system bundle that exists
/// (`bxtls`); a machine with neither is refused.
pub fn load_roots(ca_file: Option<&Path>) -> Result<bxtls::Bundle, SetupError> {
    bxtls::load(ca_file)?.ok_or_else(|| {
        SetupError::Ca(format!(
            "no CA bundle for the https provider: none of {} exists; set [provider] ca_file",
            bxtls::SYSTEM_CA_FILES.join(", ")
        ))
    })
}

impl Http {
    /// The client for `endpoint`: no proxy from the environment (Landlock allows the
    /// provider's port only), no redirects (a redirect could carry the key elsewhere), TLS
    /// with `roots` for `https`, and a resolver that knows the provider's host alone, looked up
    /// now: call it before the sandbox closes.
    pub fn new(
        kind: ProviderKind,
        max_tokens_key: MaxTokensKey,
        endpoint: Endpoint,
        key: ApiKey,
        key_source: std::path::PathBuf,
        roots: Vec<Certificate<'static>>,
    ) -> Http {
        let mut cfg = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .max_redirects(0)
            .https_only(endpoint.tls)
            .user_agent(concat!("inferproxy/", env!("CARGO_PKG_VERSION")))
            .max_response_header_size(64 * 1024);
        if endpoint.tls {
            cfg = cfg.tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::Specific(Arc::new(roots)))
                    .build(),
            );
        }
        // The provider's host, looked up now (before the sandbox), is the one name the client
        // can resolve (resolve.rs).
        let agent = ureq::Agent::with_parts(
            cfg.build(),
            ureq::unversioned::transport::DefaultConnector::default(),
            Pinned::new(&endpoint.host, endpoint.port),
        );
        Http {
            kind,
            max_tokens_key,
            endpoint,
            key,
            key_source,
            agent,
        }
    }

    /// The endpoint requests go to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The provider's list of models (`GET .../models`, which both APIs have), asked with the
    /// key: whether the provider answers and takes the key, without spending a token. A server
    /// that answers but has no such list (HTTP 404) answers all the same.
    pub fn probe(&self) -> Result<String, InferError> {
        let url = match self.kind {
            ProviderKind::Anthropic => self.endpoint.url.replace("/v1/messages", "/v1/models"),
            _ => self.endpoint.url.replace("/chat/completions", "/models"),
        };
        let rb = self.authorized(self.agent.get(&url)).map_err(|f| f.error)?;
        let resp = rb
            .config()
            .timeout_global(Some(PROBE_TIMEOUT))
            .build()
            .call()
            .map_err(|e| {
                InferError::Unreachable(format!(
                    "{url} could not be reached: {}",
                    self.key.redact(&e.to_string())
                ))
            })?;
        let status = resp.status().as_u16();
        match status {
            200..=299 => Ok(format!("{url} answered {status}")),
            404 => Ok(format!(
                "{} answers (it has no model list: {url} answered 404)",
                self.endpoint.url
            )),
            _ => {
                let failure = self.refusal(resp.into_body(), status, None);
                Err(failure.error)
            }
        }
    }

    /// The file the key was read from.
    pub fn key_source(&self) -> &Path {
        &self.key_source
    }

    fn parser(&self, max_tokens: u32) -> Box<dyn StreamParser> {
        match self.kind {
            ProviderKind::Anthropic => Box::new(anthropic::Stream::new(max_tokens)),
            _ => Box::new(openai::Stream::new(max_tokens)),
        }
    }

    fn body(&self, req: &InferRequest, slot: &Slot) -> Vec<u8> {
        let v = match self.kind {
            ProviderKind::Anthropic => anthropic::request_body(req, slot),
            _ => openai::request_body(req, slot, self.max_tokens_key),
        };
        v.to_string().into_bytes()
    }

    /// One request, retried by the rules in the module doc; given up once `gone` says the
    /// caller went away.
    fn infer(
        &self,
        req: &InferRequest,
        slot: &Slot,
        limits: &Limits,
        deliver: &mut dyn FnMut(&str),
        gone: &dyn Fn() -> bool,
    ) -> Result<InferReply, InferError> {
        let until = Instant::now()
            .checked_add(limits.timeout())
            .ok_or_else(|| {
                InferError::Unreachable("the deadline is past what the clock can hold".into())
            })?;
        let body = self.body(req, slot);
        let redactor = self.key.redactor();
        let mut forwarded = false;
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            // The text is forwarded through a redactor that holds back what could be the start
            // of the key, so a key split across two events never leaves in halves.
            let mut shown = redactor.stream();
            let result = {
                let mut forward = |t: &str| {
                    let out = shown.push(t);
                    if !out.is_empty() {
                        forwarded = true;
                        deliver(&out);
                    }
                };
                self.attempt(&body, slot.max_tokens, until, limits, &mut forward, gone)
            };
            let failure = match result {
                Ok(draft) => {
                    let rest = shown.finish();
                    if !rest.is_empty() {
                        deliver(&rest);
                    }
                    return draft
                        .finish(req.first_call)
                        .map(|reply| redactor.reply(reply))
                        .map_err(|e| e.redacted(&redactor));
                }
                Err(f) => f,
            };
            let error = with_attempts(failure.error, attempt).redacted(&redactor);
            if !failure.retryable || forwarded || attempt > limits.retries || gone() {
                return Err(error);
            }
            let wait = failure
                .retry_after
                .unwrap_or_else(|| retry::backoff(limits.backoff(), attempt));
            let left = until.saturating_duration_since(Instant::now());
            if wait >= left {
                tracing::info!(
                    "inferproxy: no retry after attempt {attempt}: the wait of {} ms is past the deadline",
                    wait.as_millis()
                );
                return Err(error);
            }
            tracing::info!(
                "inferproxy: attempt {attempt} failed, retrying in {} ms: {error}",
                wait.as_millis()
            );
            std::thread::sleep(wait);
        }
    }

    /// One try: send the request, then read the provider's answer, whole or streamed.
    fn attempt(
        &self,
        body: &[u8],
        max_tokens: u32,
        until: Instant,
        limits: &Limits,
        deliver: &mut dyn FnMut(&str),
        gone: &dyn Fn() -> bool,
    ) -> Result<Draft, Failure> {
        let resp = self.send(body, until, limits)?;
        let status = resp.status().as_u16();
        let header = |n: &str| {
            resp.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = retry::retry_after(
            header("retry-after-ms").as_deref(),
            header("retry-after").as_deref(),
            SystemTime::now(),
        );
        let content_type = header("content-type")
            .map(|c| c.trim_start().to_ascii_lowercase())
            .unwrap_or_default();
        let json = content_type.starts_with("application/json");
        let body = resp.into_body();
        if !(200..300).contains(&status) {
            return Err(self.refusal(body, status, retry_after));
        }
        // A web page where the API should answer (a base URL that names a site, or a web
        // server in front of the API): said as such, not as a stream that was cut off.
        if content_type.starts_with("text/html") || content_type.starts_with("application/xhtml") {
            return Err(Failure::fatal(InferError::malformed(format!(
                "{} answered {status} with an HTML page, not the API's JSON or event stream: is \
                 the base URL the API's (OpenAI-compatible ones end in /v1)?",
                self.endpoint.url
            ))));
        }
        // No byte limit on the body: a stream is read an event at a time (each bounded), what
        // it gathers is bounded by MAX_REPLY, and its duration by the deadline. A long reply's
        // event framing alone can be many times its text.
        let reader = body.into_reader();
        let read = Reading {
            key: &self.key,
            until,
            timeout_ms: limits.timeout_ms,
            gone,
        };
        if json {
            self.read_whole(reader, max_tokens, &read, deliver)
        } else {
            self.read_stream(reader, max_tokens, &read, deliver)
        }
    }

    /// The request with its auth header, sent with what is left of the deadline.
    fn send(
        &self,
        body: &[u8],
        until: Instant,
        limits: &Limits,
    ) -> Result<ureq::http::Response<ureq::Body>, Failure> {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timeout(limits.timeout_ms, "before the request was sent"));
        }
        let rb = self
            .agent
            .post(&self.endpoint.url)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream");
        self.authorized(rb)?
            .config()
            .timeout_global(Some(left))
            .build()
            .send(body)
            .map_err(|e| self.transport_failure(e, until, limits.timeout_ms))
    }

    /// `rb` with the provider's auth: Anthropic's version and `x-api-key`, or OpenAI's
    /// `Authorization: Bearer`, marked sensitive; nothing for a keyless server.
    fn authorized<B>(
        &self,
        mut rb: ureq::RequestBuilder<B>,
    ) -> Result<ureq::RequestBuilder<B>, Failure> {
        if self.kind == ProviderKind::Anthropic {
            rb = rb.header("anthropic-version", anthropic::API_VERSION);
        }
        if self.key.is_none() {
            return Ok(rb);
        }
        let (name, value) = match self.kind {
            ProviderKind::Anthropic => ("x-api-key", self.key.header_value().to_string()),
            _ => (
                "authorization",
                format!("Bearer {}", self.key.header_value()),
            ),
        };
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            Failure::fatal(InferError::Unreachable(
                "the API key cannot be a header value".into(),
            ))
        })?;
        value.set_sensitive(true);
        if let Some(h) = rb.headers_mut() {
            h.insert(name, value);
        }
        Ok(rb)
    }

    /// A status that is not success: the provider's message from its error body.
    fn refusal(&self, body: ureq::Body, status: u16, retry_after: Option<Duration>) -> Failure {
        let mut text = String::new();
        let _ = body
            .into_with_config()
            .limit(MAX_ERROR_BODY)
            .lossy_utf8(true)
            .reader()
            .take(MAX_ERROR_BODY)
            .read_to_string(&mut text);
        // Redacted before anything is cut out of it, so no prefix of the key survives.
        let message = crate::stream::error_message(&self.key.redact(&text));
        status_failure(status, &self.endpoint.url, message, retry_after)
    }

    /// A reply sent as one JSON document.
    fn read_whole(
        &self,
        reader: impl Read,
        max_tokens: u32,
        read: &Reading<'_>,
        deliver: &mut dyn FnMut(&str),
    ) -> Result<Draft, Failure> {
        let mut text = String::new();
        reader
            .take(MAX_REPLY as u64 + 1)
            .read_to_string(&mut text)
            .map_err(|e| read.broken(e, "reading the reply"))?;
        if text.len() > MAX_REPLY {
            return Err(Failure::fatal(InferError::malformed(format!(
                "the reply is over {MAX_REPLY} bytes"
            ))));
        }
        let text = self.key.redact(&text);
        match self.kind {
            ProviderKind::Anthropic => anthropic::whole(&text, max_tokens, deliver),
            _ => openai::whole(&text, max_tokens, deliver),
        }
    }

    /// A reply streamed as server-sent events, fed to the provider's parser one at a time.
    fn read_stream(
        &self,
        reader: impl Read,
        max_tokens: u32,
        read: &Reading<'_>,
        deliver: &mut dyn FnMut(&str),
    ) -> Result<Draft, Failure> {
        let mut parser = self.parser(max_tokens);
        let mut events = sse::Reader::new(BufReader::new(reader));
        loop {
            match events.next_event() {
                Ok(Some(mut ev)) => {
                    // Whatever the provider sends is seen redacted, by the parser and by any
                    // error quoting it: a provider that echoes the key cannot make it leak.
                    ev.data = self.key.redact(&ev.data);
                    ev.name = self.key.redact(&ev.name);
                    if parser.event(&ev, deliver)? == Flow::Done {
                        return parser.finish();
                    }
                    // A caller that went away reads no more: the response is dropped, which
                    // closes the provider's connection, and a local server stops generating.
                    if (read.gone)() {
                        return Err(Failure::fatal(InferError::Abandoned));
                    }
                    if Instant::now() >= read.until {
                        return Err(timeout(read.timeout_ms, "reading the stream"));
                    }
                }
                Ok(None) => {
                    return Err(Failure::retry(InferError::malformed(
                        "the stream was cut off before its end (no [DONE] or message_stop)",
                    )));
                }
                Err(sse::SseError::Io(e)) => return Err(read.broken(e, "reading the stream")),
                Err(sse::SseError::TooLong) => {
                    return Err(Failure::fatal(InferError::malformed(format!(
                        "an event over {} bytes",
                        sse::MAX_EVENT
                    ))));
                }
                Err(sse::SseError::NotUtf8) => {
                    return Err(Failure::fatal(InferError::malformed(
                        "the stream is not UTF-8",
                    )));
                }
            }
        }
    }

    fn transport_failure(&self, e: ureq::Error, until: Instant, timeout_ms: u64) -> Failure {
        let why = self.key.redact(&e.to_string());
        match e {
            ureq::Error::Timeout(_) => timeout(timeout_ms, "waiting for the provider's answer"),
            _ if Instant::now() >= until => {
                timeout(timeout_ms, "waiting for the provider's answer")
            }
            // rustls reports a failed handshake (an untrusted certificate, a wrong name) as
            // invalid data: trying again cannot fix it.
            ureq::Error::Io(ref io) if io.kind() == std::io::ErrorKind::InvalidData => {
                Failure::fatal(InferError::Unreachable(format!(
                    "{} ({}:{}): TLS: {why}",
                    self.endpoint.url, self.endpoint.host, self.endpoint.port
                )))
            }
            ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed
            | ureq::Error::Io(_)
            | ureq::Error::Protocol(_) => Failure::retry(InferError::Unreachable(format!(
                "{} ({}:{}): {why}",
                self.endpoint.url, self.endpoint.host, self.endpoint.port
            ))),
            _ => Failure::fatal(InferError::Unreachable(format!(
                "{}: {why}",
                self.endpoint.url
            ))),
        }
    }
}

/// The deadline passed `during` something.
fn timeout(timeout_ms: u64, during: &str) -> Failure {
    Failure::fatal(InferError::Timeout {
        timeout_ms,
        during: during.to_string(),
    })
}

/// What reading a reply's body needs to name a failure.
struct Reading<'k> {
    key: &'k ApiKey,
    until: Instant,
    timeout_ms: u64,
    /// Whether the caller went away.
    gone: &'k dyn Fn() -> bool,
}

impl Reading<'_> {
    /// The body could not be read further `while` doing something.
    fn broken(&self, e: std::io::Error, what: &str) -> Failure {
        if Instant::now() >= self.until || io_is_timeout(&e) {
            timeout(self.timeout_ms, what)
        } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Failure::retry(InferError::malformed(format!(
                "the stream was cut off while {what}"
            )))
        } else {
            Failure::retry(InferError::Unreachable(format!(
                "the connection broke while {what}: {}",
                self.key.redact(&e.to_string())
            )))
        }
    }
}

/// Whether an error from reading the body is ureq's deadline running out.
fn io_is_timeout(e: &std::io::Error) -> bool {
    bxcore::deadline::is_timeout(e)
        || e.get_ref()
            .and_then(|x| x.downcast_ref::<ureq::Error>())
            .is_some_and(|x| matches!(x, ureq::Error::Timeout(_)))
}

/// What an HTTP status that is not success means.
fn status_failure(
    status: u16,
    url: &str,
    message: String,
    retry_after: Option<Duration>,
) -> Failure {
    match status {
        401 | 403 => Failure::fatal(InferError::Auth { status, message }),
        408 | 409 | 429 | 500..=599 => Failure {
            error: InferError::Overloaded {
                status,
                message,
                attempts: 1,
            },
            retryable: true,
            retry_after,
        },
        _ => Failure::fatal(InferError::Refused {
            status,
            url: url.to_string(),
            message,
        }),
    }
}

/// The error with the number of attempts made, where it counts them.
fn with_attempts(e: InferError, n: u32) -> InferError {
    match e {
        InferError::Overloaded {
            status, message, ..
        } => InferError::Overloaded {
            status,
            message,
            attempts: n,
        },
        other => other,
    }
}

/// Everything one inference needs: the provider, the slots and the limits.
#[derive(Debug)]
pub struct Inference {
    provider: Provider,
    slots: BTreeMap<String, Slot>,
    limits: Limits,
}

impl Inference {
    pub fn new(provider: Provider, slots: BTreeMap<String, Slot>, limits: Limits) -> Inference {
        Inference {
            provider,
            slots,
            limits,
        }
    }

    /// Build everything from a loaded configuration: read the key (`credentials_directory` is
    /// `$CREDENTIALS_DIRECTORY`), the CA bundle and the script. Call it before the sandbox.
    pub fn from_config(
        cfg: &Config,
        credentials_directory: Option<&Path>,
    ) -> Result<Inference, SetupError> {
        let provider = match cfg.provider.kind {
            ProviderKind::Script => {
                let path = cfg.provider.script.as_deref().unwrap_or(Path::new(""));
                Provider::Script(Script::load(path).map_err(SetupError::Script)?)
            }
            kind => {
                let endpoint = cfg.endpoint().map_err(SetupError::Ca)?;
                let (key, source) = if cfg.provider.keyless {
                    (ApiKey::none(), std::path::PathBuf::new())
                } else {
                    let source =
                        ApiKey::source(cfg.provider.api_key_file.as_deref(), credentials_directory)
                            .map_err(SetupError::Key)?;
                    (ApiKey::read(&source).map_err(SetupError::Key)?, source)
                };
                let roots = if endpoint.tls {
                    load_roots(cfg.provider.ca_file.as_deref())?.certs
                } else {
                    Vec::new()
                };
                let max_tokens_key = cfg.provider.max_tokens_key.unwrap_or_default();
                Provider::Http(Http::new(
                    kind,
                    max_tokens_key,
                    endpoint,
                    key,
                    source,
                    roots,
                ))
            }
        };
        Ok(Inference::new(
            provider,
            cfg.slots.clone(),
            cfg.limits.clone(),
        ))
    }

    pub fn provider(&self) -> &Provider {
        &self.provider
    }

    /// Whether the provider answers now, for `provider_probe` (no token spent).
    pub fn probe(&self) -> bxcore::ProviderReport {
        match &self.provider {
            Provider::Script(s) => bxcore::ProviderReport {
                provider: format!("script {}", s.path().display()),
                reachable: true,
                detail: "the script provider answers from its file, with no network".to_string(),
            },
            Provider::Http(h) => {
                let provider = format!("{} at {}", h.kind.name(), h.endpoint.url);
                match h.probe() {
                    Ok(detail) => bxcore::ProviderReport {
                        provider,
                        reachable: true,
                        detail,
                    },
                    Err(e) => bxcore::ProviderReport {
                        provider,
                        reachable: false,
                        detail: e.pointed().to_string(),
                    },
                }
            }
        }
    }

    /// Answer one request, forwarding text to `deliver` as it arrives.
    pub fn infer(
        &self,
        req: &InferRequest,
        deliver: &mut dyn FnMut(&str),
    ) -> Result<InferReply, InferError> {
        self.infer_while(req, deliver, &|| false)
    }

    /// The same, given up (`Abandoned`) once `gone` says the caller went away: checked after
    /// each event of a stream and before a retry.
    pub fn infer_while(
        &self,
        req: &InferRequest,
        deliver: &mut dyn FnMut(&str),
        gone: &dyn Fn() -> bool,
    ) -> Result<InferReply, InferError> {
        let slot = self
            .slots
            .get(&req.slot)
            .ok_or_else(|| InferError::UnknownSlot(req.slot.clone()))?;
        let bytes = serde_json::to_vec(&req.messages)
            .map(|v| v.len())
            .unwrap_or(0)
            + serde_json::to_vec(&req.tools).map(|v| v.len()).unwrap_or(0);
        let estimate = (bytes / 4) as u64;
        if estimate > slot.context_tokens {
            return Err(InferError::OverContext {
                slot: req.slot.clone(),
                estimate,
                budget: slot.context_tokens,
            });
        }
        match &self.provider {
            Provider::Script(s) => s.infer(req, deliver),
            Provider::Http(h) => h.infer(req, slot, &self.limits, deliver, gone),
        }
    }
}
