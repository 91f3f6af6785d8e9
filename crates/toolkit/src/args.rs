//! Tool arguments as typed structs. serde refuses a wrong type, a missing argument and an unknown
//! one (`deny_unknown_fields`); [`Args::check`] says what a type cannot (lengths, an address's
//! form). No JSON Schema validator runs in the broker: four small schemas cost it about 3 MB of
//! heap and a regex engine (docs/performance.md). The schema the model is shown says the same as
//! the struct; `tests/args_agree.rs` holds the two together with a real validator as the judge.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The longest path a workspace tool takes, in characters.
pub const MAX_PATH: usize = 4096;
/// The longest address `web_fetch` takes, in characters.
pub const MAX_URL: usize = 8192;
/// The most a write takes, in characters (and so at most four times as many bytes).
pub const MAX_WRITE: usize = 512 * 1024;
/// The longest reason for a refusal: a hostile argument is not echoed whole.
const MAX_MESSAGE: usize = 512;

/// One tool's arguments: what serde parses, then checks serde's types cannot express.
pub trait Args: DeserializeOwned {
    /// The checks beyond the types; the error names the argument.
    fn check(&self) -> Result<(), String>;
}

/// `args` as `A`, or why not, for a person (and the model): the `failed` message of policy step 2.
pub fn parse<A: Args>(tool: &str, args: &Value) -> Result<A, String> {
    // serde's derive would also take a struct from an array of its fields in order; the schema
    // says an object, so only an object is taken.
    let object = match args {
        Value::Object(_) => Ok(args),
        other => Err(format!(
            "the arguments must be an object, not {}",
            json_type(other)
        )),
    };
    let parsed = object
        .and_then(|args| {
            serde_path_to_error::deserialize::<_, A>(args).map_err(|e| {
                let at = e.path().to_string();
                if at == "." {
                    format!("the arguments: {}", e.inner())
                } else {
                    format!("the argument {at:?}: {}", e.inner())
                }
            })
        })
        .and_then(|a| a.check().map(|()| a));
    parsed.map_err(|why| {
        let mut why = why;
        if why.len() > MAX_MESSAGE {
            let mut end = MAX_MESSAGE;
            while !why.is_char_boundary(end) {
                end -= 1;
            }
            why.truncate(end);
            why.push('…');
        }
        format!("the arguments do not match {tool}'s schema: {why}")
    })
}

/// The JSON type of `v`, as a schema names it.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `value` has between `min` and `max` characters (JSON Schema counts characters, not bytes).
fn length(name: &str, value: &str, min: usize, max: usize) -> Result<(), String> {
    // Counting stops after `max + 1`: a huge argument costs no more than a limit's worth.
    let n = value.chars().take(max + 1).count();
    if n < min {
        Err(format!(
            "the argument {name:?} must be at least {min} character(s) long"
        ))
    } else if n > max {
        Err(format!(
            "the argument {name:?} is longer than {max} characters"
        ))
    } else {
        Ok(())
    }
}

fn path_schema(what: &str) -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_PATH,
        "description": format!("the absolute path of the {what}, inside a workspace root"),
    })
}

/// An object schema of `properties`, each required, nothing else allowed.
fn object_schema(properties: Value) -> Value {
    let required: Vec<String> = properties
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// `{path}`: `workspace_list` and `workspace_read`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    pub path: String,
}

impl PathArgs {
    /// Its schema; `what` is "file" or "directory", for the model.
    pub fn schema(what: &str) -> Value {
        object_schema(json!({ "path": path_schema(what) }))
    }
}

impl Args for PathArgs {
    fn check(&self) -> Result<(), String> {
        length("path", &self.path, 1, MAX_PATH)
    }
}

/// `{path, content}`: `workspace_write`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    pub path: String,
    pub content: String,
}

impl WriteArgs {
    pub fn schema() -> Value {
        object_schema(json!({
            "path": path_schema("file"),
            "content": {"type": "string", "maxLength": MAX_WRITE, "description": "the whole new content"},
        }))
    }
}

impl Args for WriteArgs {
    fn check(&self) -> Result<(), String> {
        length("path", &self.path, 1, MAX_PATH)?;
        length("content", &self.content, 0, MAX_WRITE)
    }
}

/// `{url}`: `web_fetch`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchArgs {
    pub url: String,
}

/// The form of a `web_fetch` address, in the schema's words.
pub const URL_PATTERN: &str = "^https://[^\\s\\u0085\\ufeff]+$";

impl FetchArgs {
    pub fn schema() -> Value {
        object_schema(json!({
            "url": {
                "type": "string",
                "pattern": URL_PATTERN,
                "maxLength": MAX_URL,
                "description": "the https:// address of the page",
            },
        }))
    }
}

impl Args for FetchArgs {
    fn check(&self) -> Result<(), String> {
        length("url", &self.url, 0, MAX_URL)?;
        // URL_PATTERN by hand: "https://", then one or more characters none of which is white
        // space in any dialect's sense (Unicode's White_Space and ECMAScript's `\s`, which
        // differ in U+0085 and U+FEFF; the pattern names both).
        let rest = self.url.strip_prefix("https://");
        match rest {
            Some(rest) if !rest.is_empty() && !rest.chars().any(is_space) => Ok(()),
            _ => Err(
                "the argument \"url\" must be an https:// address without white space".to_string(),
            ),
        }
    }
}

/// A character `URL_PATTERN` refuses: Unicode White_Space (U+0085 included) and U+FEFF.
fn is_space(c: char) -> bool {
    c.is_whitespace() || c == '\u{85}' || c == '\u{feff}'
}

/// The most arguments a `run` call's `argv` takes (the program included).
pub const MAX_ARGV: usize = 256;
/// The longest single `argv` entry, in characters.
pub const MAX_ARG: usize = 8192;
/// The most `stdin` a `run` call takes, in characters.
pub const MAX_STDIN: usize = 64 * 1024;
/// The shortest deadline a `run` call takes, in milliseconds.
pub const MIN_TIMEOUT_MS: u64 = 1;
/// The longest deadline a `run` call takes, in milliseconds: ten minutes.
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// `{argv, cwd, stdin?, timeout_ms?}`: `run`. An argv, never a shell string: `argv[0]` is the
/// program (an absolute path, or a bare name looked up on the fixed `PATH`), the rest are its
/// arguments, each passed to it as it is.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    pub argv: Vec<String>,
    pub cwd: String,
    #[serde(default, deserialize_with = "present")]
    pub stdin: Option<String>,
    /// A whole number of milliseconds (`30000` and `30000.0` alike, as JSON Schema's
    /// `integer` takes both); its bounds are checked in [`Args::check`].
    #[serde(default, deserialize_with = "whole_number")]
    pub timeout_ms: Option<f64>,
}

/// An optional argument that, when present, has its type: `null` is not a string.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A JSON number with no fractional part (its range is checked later, with the bounds' words).
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    let v = n
        .as_f64()
        .ok_or_else(|| serde::de::Error::custom("not a number"))?;
    if v.fract() != 0.0 || !v.is_finite() {
        return Err(serde::de::Error::custom(format!(
            "expected a whole number, not {n}"
        )));
    }
    Ok(Some(v))
}

impl RunArgs {
    /// The deadline in milliseconds: the argument, or 30 seconds.
    pub fn timeout_ms(&self) -> u64 {
        // `check` has bounded it to MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS.
        self.timeout_ms.map_or(DEFAULT_TIMEOUT_MS, |t| t as u64)
    }
}

/// The deadline of a `run` call that names none.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// Characters no `argv` entry may hold: the kernel ends a string at the first NUL.
pub const ARG_PATTERN: &str = "^[^\\u0000]*$";

impl RunArgs {
    pub fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "argv": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_ARGV,
                    "items": {
                        "type": "string",
                        "maxLength": MAX_ARG,
                        "pattern": ARG_PATTERN,
                    },
                    "description": "the program and its arguments, one string each, passed as they are \
                                    (no shell); the program is an absolute path or a name on the fixed PATH",
                },
                "cwd": path_schema("directory the program runs in"),
                "stdin": {
                    "type": "string",
                    "maxLength": MAX_STDIN,
                    "description": "what the program reads on its standard input (empty if absent)",
                },
                "timeout_ms": {
                    "type": "integer",
                    "minimum": MIN_TIMEOUT_MS,
                    "maximum": MAX_TIMEOUT_MS,
                    "description": "how long the program may run, in milliseconds (30000 if absent)",
                },
            },
            "required": ["argv", "cwd"],
            "additionalProperties": false,
        })
    }
}

impl Args for RunArgs {
    fn check(&self) -> Result<(), String> {
        if self.argv.is_empty() {
            return Err("the argument \"argv\" must hold at least the program to run".to_string());
        }
        if self.argv.len() > MAX_ARGV {
            return Err(format!(
                "the argument \"argv\" holds more than {MAX_ARGV} entries"
            ));
        }
        for (i, a) in self.argv.iter().enumerate() {
            length(&format!("argv[{i}]"), a, 0, MAX_ARG)?;
            if a.contains('\0') {
                return Err(format!(
                    "the argument \"argv[{i}]\" holds a NUL character, which no program can be given"
                ));
            }
        }
        length("cwd", &self.cwd, 1, MAX_PATH)?;
        if let Some(stdin) = &self.stdin {
            length("stdin", stdin, 0, MAX_STDIN)?;
        }
        if let Some(t) = self.timeout_ms {
            if !(MIN_TIMEOUT_MS as f64..=MAX_TIMEOUT_MS as f64).contains(&t) {
                return Err(format!(
                    "the argument \"timeout_ms\" must be between {MIN_TIMEOUT_MS} and {MAX_TIMEOUT_MS}"
                ));
            }
        }
        Ok(())
    }
}
