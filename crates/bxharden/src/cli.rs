//! Every daemon's command line: `serve --config FILE`, `check --config FILE`, and the daemon's
//! own commands beside them ([`More`]), each a table row ([`Cmd`]) that `--help` shows and the
//! reader checks against. Arguments are read with `lexopt` (a small, pedantic reader: `--name
//! value` and `--name=value`, never a guess), not clap: clap's builder was about 200 kB of every
//! daemon's resident memory at rest, for a command line of two to four commands whose options
//! are all one required path or number (docs/performance.md). bxctl, the owner's tool, keeps
//! clap.
//!
//! The words follow clap's, which bxctl shows: `Usage: NAME COMMAND --config <CONFIG>`, `error:`
//! lines, status 2 for a usage error, 0 for `--help` and `--version`.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::str::FromStr;

use crate::log::Daemon;

/// The words of a daemon's command line beside its name and version: what the daemon is, what
/// `serve` serves and what `check` checks, as `--help` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub about: &'static str,
    pub serve: &'static str,
    pub check: &'static str,
}

/// One command of the table: its name, what it does (`--help`), and either its options or the
/// commands beneath it (brokerd's `audit verify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cmd {
    pub name: &'static str,
    pub about: &'static str,
    pub body: Body,
}

/// What follows a command's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Its options, each `--NAME VALUE`, every one required, each at most once.
    Options(&'static [&'static str]),
    /// A command of this list.
    Commands(&'static [Cmd]),
}

/// A daemon's own commands, beside `serve` and `check`.
pub trait More: Sized {
    /// The commands, in the order `--help` lists them after `serve` and `check`.
    const COMMANDS: &'static [Cmd];

    /// The command the reader matched: `args.path()` names it (`["audit", "verify"]`), and
    /// every option of its row is there. `Err` is what is wrong with a value (`--at`).
    fn from_args(args: &Args) -> Result<Self, String>;
}

/// No command beyond `serve` and `check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoMore {}

impl More for NoMore {
    const COMMANDS: &'static [Cmd] = &[];

    fn from_args(args: &Args) -> Result<Self, String> {
        Err(format!("no command {}", args.path().join(" ")))
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command<E = NoMore> {
    /// Serve the daemon's sockets.
    Serve { config: PathBuf },
    /// Load and check the configuration, print what would be served.
    Check { config: PathBuf },
    /// The daemon's own commands.
    More(E),
}

/// A matched command: the names that led to it and its options' values.
#[derive(Debug)]
pub struct Args {
    path: Vec<&'static str>,
    values: Vec<(&'static str, OsString)>,
}

impl Args {
    /// The names of the command, outermost first.
    pub fn path(&self) -> &[&'static str] {
        &self.path
    }

    /// The value of `--name`, as a path.
    pub fn path_of(&self, name: &str) -> PathBuf {
        PathBuf::from(self.value(name))
    }

    /// The value of `--name`, read as a `T`; `Err` says which option and why.
    pub fn parse<T: FromStr>(&self, name: &str) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        let raw = self.value(name);
        let text = raw.to_string_lossy();
        text.parse()
            .map_err(|e| format!("invalid value '{text}' for '{}': {e}", option_usage(name)))
    }

    fn value(&self, name: &str) -> OsString {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
            // Every option of a row is required, so the reader never matches without it.
            .unwrap_or_default()
    }
}

/// Why the command line ends the process before the daemon runs: what to print, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CliEnd {
    /// `--help`: the text, on standard output, status 0.
    Help(String),
    /// `--version`: `NAME VERSION`, on standard output, status 0.
    Version(String),
    /// A usage error: the text (`error: ...`, the command's usage), on standard error, status 2.
    Usage(String),
}

impl CliEnd {
    /// The process's exit status.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliEnd::Help(_) | CliEnd::Version(_) => 0,
            CliEnd::Usage(_) => 2,
        }
    }

    /// What is printed.
    pub fn text(&self) -> &str {
        match self {
            CliEnd::Help(t) | CliEnd::Version(t) | CliEnd::Usage(t) => t,
        }
    }

    /// Print the text where it goes and end the process with its status.
    pub fn exit(&self) -> ! {
        match self {
            CliEnd::Usage(t) => eprint!("{t}"),
            CliEnd::Help(t) | CliEnd::Version(t) => print!("{t}"),
        }
        std::process::exit(self.exit_code())
    }
}

/// Every daemon's command line: `serve` or `check`, each with `--config FILE`, and the daemon's
/// own commands `E`, named by its [`Daemon`] (name and version) and worded by its [`Usage`].
#[derive(Debug)]
pub struct Cli<E = NoMore>(std::marker::PhantomData<E>);

impl<E: More> Cli<E> {
    /// Read the command line from `args` (the program's name first).
    pub fn try_parse_from<I, T>(
        daemon: Daemon,
        usage: &Usage,
        args: I,
    ) -> Result<Command<E>, CliEnd>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let table = Table::new(daemon, usage, E::COMMANDS);
        let args = table.read(lexopt::Parser::from_iter(args))?;
        match args.path.as_slice() {
            ["serve"] => Ok(Command::Serve {
                config: args.path_of("config"),
            }),
            ["check"] => Ok(Command::Check {
                config: args.path_of("config"),
            }),
            _ => E::from_args(&args)
                .map(Command::More)
                .map_err(|why| table.usage_error(&why, &args.path)),
        }
    }

    /// Read the process's command line; a usage error, `--help` or `--version` is printed and
    /// ends the process (status 2 for an error, 0 otherwise).
    pub fn parse(daemon: Daemon, usage: &Usage) -> Command<E> {
        Self::try_parse_from(daemon, usage, std::env::args_os()).unwrap_or_else(|end| end.exit())
    }
}

/// The whole table of one daemon's commands.
struct Table {
    daemon: Daemon,
    about: &'static str,
    top: Vec<Cmd>,
}

const CONFIG: &[&str] = &["config"];

impl Table {
    /// `serve` and `check`, then the daemon's own `more`.
    fn new(daemon: Daemon, usage: &Usage, more: &[Cmd]) -> Self {
        let mut top = vec![
            Cmd {
                name: "serve",
                about: usage.serve,
                body: Body::Options(CONFIG),
            },
            Cmd {
                name: "check",
                about: usage.check,
                body: Body::Options(CONFIG),
            },
        ];
        top.extend_from_slice(more);
        Self {
            daemon,
            about: usage.about,
            top,
        }
    }

    fn read(&self, mut p: lexopt::Parser) -> Result<Args, CliEnd> {
        use lexopt::Arg;
        let mut path: Vec<&'static str> = Vec::new();
        let mut commands: &[Cmd] = &self.top;
        // Down the table to a command with options.
        let options = loop {
            let here = match p.next() {
                Ok(Some(Arg::Short('h') | Arg::Long("help"))) => {
                    return Err(CliEnd::Help(self.help(&path)));
                }
                Ok(Some(Arg::Short('V') | Arg::Long("version"))) if path.is_empty() => {
                    return Err(CliEnd::Version(format!(
                        "{} {}\n",
                        self.daemon.name, self.daemon.version
                    )));
                }
                Ok(Some(Arg::Value(v))) => v,
                Ok(Some(other)) => {
                    let why = format!("unexpected argument '{}' found", shown(&other));
                    return Err(self.usage_error(&why, &path));
                }
                Ok(None) => {
                    return Err(self.usage_error("a command is required", &path));
                }
                Err(e) => return Err(self.usage_error(&e.to_string(), &path)),
            };
            let name = here.to_string_lossy();
            let Some(cmd) = commands.iter().find(|c| c.name == name) else {
                let why = format!("unrecognized subcommand '{name}'");
                return Err(self.usage_error(&why, &path));
            };
            path.push(cmd.name);
            match cmd.body {
                Body::Options(options) => break options,
                Body::Commands(below) => commands = below,
            }
        };
        let mut values: Vec<(&'static str, OsString)> = Vec::new();
        loop {
            match p.next() {
                Ok(Some(Arg::Short('h') | Arg::Long("help"))) => {
                    return Err(CliEnd::Help(self.help(&path)));
                }
                Ok(Some(Arg::Long(long))) => {
                    let Some(name) = options.iter().copied().find(|o| *o == long) else {
                        let why = format!("unexpected argument '--{long}' found");
                        return Err(self.usage_error(&why, &path));
                    };
                    if values.iter().any(|(n, _)| *n == name) {
                        let why = format!(
                            "the argument '{}' cannot be used multiple times",
                            option_usage(name)
                        );
                        return Err(self.usage_error(&why, &path));
                    }
                    match p.value() {
                        Ok(v) => values.push((name, v)),
                        Err(_) => {
                            let why = format!(
                                "a value is required for '{}' but none was supplied",
                                option_usage(name)
                            );
                            return Err(self.usage_error(&why, &path));
                        }
                    }
                }
                Ok(Some(other)) => {
                    let why = format!("unexpected argument '{}' found", shown(&other));
                    return Err(self.usage_error(&why, &path));
                }
                Ok(None) => break,
                Err(e) => return Err(self.usage_error(&e.to_string(), &path)),
            }
        }
        let missing: Vec<String> = options
            .iter()
            .filter(|o| !values.iter().any(|(n, _)| n == *o))
            .map(|o| format!("  {}", option_usage(o)))
            .collect();
        if !missing.is_empty() {
            let why = format!(
                "the following required arguments were not provided:\n{}",
                missing.join("\n")
            );
            return Err(self.usage_error(&why, &path));
        }
        Ok(Args { path, values })
    }

    /// The row at `path`, if it names one.
    fn find(&self, path: &[&str]) -> Option<&Cmd> {
        let mut commands: &[Cmd] = &self.top;
        let mut found = None;
        for name in path {
            let cmd = commands.iter().find(|c| c.name == *name)?;
            if let Body::Commands(below) = cmd.body {
                commands = below;
            }
            found = Some(cmd);
        }
        found
    }

    /// `Usage: NAME PATH ...` for the command at `path`.
    fn usage_line(&self, path: &[&str]) -> String {
        let mut line = format!("Usage: {}", self.daemon.name);
        for name in path {
            line.push(' ');
            line.push_str(name);
        }
        match self.find(path).map(|c| c.body) {
            Some(Body::Options(options)) => {
                for o in options {
                    line.push(' ');
                    line.push_str(&option_usage(o));
                }
            }
            _ => line.push_str(" <COMMAND>"),
        }
        line
    }

    fn usage_error(&self, why: &str, path: &[&str]) -> CliEnd {
        CliEnd::Usage(format!(
            "error: {why}\n\n{}\n\nFor more information, try '--help'.\n",
            self.usage_line(path)
        ))
    }

    /// `--help` at `path`: what it does, its usage, then its commands or its options.
    fn help(&self, path: &[&str]) -> String {
        let here = self.find(path);
        let mut text = String::new();
        let _ = writeln!(text, "{}\n", here.map_or(self.about, |c| c.about));
        let _ = writeln!(text, "{}\n", self.usage_line(path));
        let mut rows: Vec<(String, &str)> = Vec::new();
        let commands: &[Cmd] = match here.map(|c| c.body) {
            Some(Body::Options(options)) => {
                rows.extend(options.iter().map(|o| (option_usage(o), "")));
                &[]
            }
            Some(Body::Commands(below)) => below,
            None => &self.top,
        };
        if !commands.is_empty() {
            let width = commands.iter().map(|c| c.name.len()).max().unwrap_or(0);
            text.push_str("Commands:\n");
            for c in commands {
                let _ = writeln!(text, "  {:width$}  {}", c.name, c.about);
            }
            text.push('\n');
        }
        text.push_str("Options:\n");
        rows.push(("-h, --help".into(), "Print help"));
        if path.is_empty() {
            rows.push(("-V, --version".into(), "Print version"));
        }
        let width = rows.iter().map(|(o, _)| o.len()).max().unwrap_or(0);
        for (o, what) in rows {
            let _ = writeln!(text, "  {o:width$}  {what}");
        }
        text.lines()
            .map(str::trim_end)
            .fold(String::new(), |mut out, l| {
                out.push_str(l);
                out.push('\n');
                out
            })
    }
}

/// `--config <CONFIG>`.
fn option_usage(name: &str) -> String {
    format!("--{name} <{}>", name.to_ascii_uppercase())
}

/// An argument as the person typed it.
fn shown(arg: &lexopt::Arg) -> String {
    match arg {
        lexopt::Arg::Short(c) => format!("-{c}"),
        lexopt::Arg::Long(l) => format!("--{l}"),
        lexopt::Arg::Value(v) => v.to_string_lossy().into_owned(),
    }
}
