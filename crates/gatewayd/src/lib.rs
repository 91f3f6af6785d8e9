//! gatewayd: the tools' only door to the network.
//!
//! brokerd asks for one fetch per connection on gateway.sock (`fetch_request`); gatewayd
//! makes it only to a host on its allow-list (`[[hosts]]`), over HTTPS unless the host's entry
//! allows plain HTTP, to addresses it resolved once and checked (no loopback, private,
//! link-local, metadata or other internal address unless the entry lists it), following at most
//! five redirects, each checked the same way, within limits of time and size. It adds each
//! host's credential to that host's requests only, and refuses any request that carries a
//! credential's value out. The reply is the page as readable text; brokerd marks the session
//! that reads it untrusted. `docs/gateway.md` tells how to set it up.

pub mod address;
pub mod config;
pub mod daemon;
pub mod dns;
pub mod fetch;
pub mod hosts;
pub mod secrets;
pub mod text;

pub use config::Config;
pub use fetch::{FetchError, Fetched, Gateway};
