//! The bearer token against a real Honcho with its auth on (`$HONCHO_AUTH_URL`, its admin token
//! in `$HONCHO_AUTH_TOKEN_FILE`; `.ci/run` brings one up). Each test in a workspace of its own.

use std::path::Path;

use bxcore::runbook::Anchored;
use honcho::{BaseUrl, Client, Error, Id, Options, Token};
use serde_json::Map;

fn server() -> Option<(BaseUrl, String)> {
    let (url, token_file) = bxtest::honcho_auth()?;
    let admin = std::fs::read_to_string(&token_file)
        .unwrap_or_else(|e| panic!("{}: {e}", token_file.display()));
    Some((BaseUrl::parse(&url).unwrap(), admin.trim().to_string()))
}

/// `text` in an owner-only key file under `dir`, read as a token.
fn token(dir: &Path, text: &str) -> Token {
    let p = dir.join("honcho.key");
    bxtest::write_private(&p, text);
    Token::read(&p).unwrap()
}

fn id(s: &str) -> Id {
    Id::new(s).unwrap()
}

/// A key scoped to `workspace`, minted with the admin token (`POST /v3/keys`).
fn workspace_key(base: &BaseUrl, admin: &str, workspace: &Id) -> String {
    let url = format!("{base}/v3/keys?workspace_id={workspace}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(bxtest::DEADLINE))
        .build()
        .into();
    let mut resp = agent
        .post(&url)
        .header("authorization", &format!("Bearer {admin}"))
        .send_empty()
        .unwrap();
    // bounded: the agent's global timeout covers the whole answer.
    let text = resp.body_mut().read_to_string().unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["key"].as_str().unwrap().to_string()
}

#[test]
fn the_admin_token_from_a_key_file_is_accepted() {
    let Some((base, admin)) = server() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let c = Client::new(base, Some(token(dir.path(), &admin)), Options::default());
    let w = id(&bxtest::unique_name("auth-admin"));
    assert_eq!(c.workspace(&w, Map::new()).unwrap().id, w);
}

#[test]
fn without_a_token_a_server_with_auth_on_refuses_and_says_so() {
    let Some((base, _)) = server() else { return };
    let c = Client::new(base, None, Options::default());
    let w = id(&bxtest::unique_name("auth-none"));
    let e = c.workspace(&w, Map::new()).unwrap_err();
    assert!(matches!(e, Error::Unauthorized { status: 401, .. }), "{e}");
    assert!(!e.retryable());
    assert_eq!(e.anchor(), "honcho-auth");
    assert!(e.to_string().contains("No access token provided"), "{e}");
}

#[test]
fn a_wrong_token_is_refused_without_being_shown() {
    let Some((base, _)) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let c = Client::new(
        base,
        Some(token(dir.path(), "not-a-real-token-4711")),
        Options::default(),
    );
    let e = c
        .workspace(&id(&bxtest::unique_name("auth-bad")), Map::new())
        .unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
    assert!(!e.to_string().contains("4711"), "{e}");
}

#[test]
fn a_workspace_key_works_in_its_workspace_and_is_refused_in_another() {
    let Some((base, admin)) = server() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let admin_client = Client::new(
        base.clone(),
        Some(token(dir.path(), &admin)),
        Options::default(),
    );
    let mine = id(&bxtest::unique_name("auth-mine"));
    let other = id(&bxtest::unique_name("auth-other"));
    admin_client.workspace(&mine, Map::new()).unwrap();
    admin_client.workspace(&other, Map::new()).unwrap();
    let key = workspace_key(&base, &admin, &mine);
    let c = Client::new(base, Some(token(dir.path(), &key)), Options::default());
    let s = c
        .create_session(&mine, &id("s"), Map::new(), &[])
        .expect("the key works in its own workspace");
    assert_eq!(s.workspace(), &mine);
    let e = c
        .create_session(&other, &id("s"), Map::new(), &[])
        .unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
}
