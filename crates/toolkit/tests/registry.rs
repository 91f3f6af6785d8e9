//! The registry: typed arguments checked before anything else, and a policy file that can
//! tighten a tool but never loosen it.

use std::collections::BTreeMap;

use bxcore::DataClass;
use serde_json::json;
use toolkit::{ApprovalRule, Effect, Env, Reads, Registry, Tightening, TighteningError};

fn tight(name: &str, t: Tightening) -> BTreeMap<String, Tightening> {
    BTreeMap::from([(name.to_string(), t)])
}

#[test]
fn the_five_tools_are_offered_with_object_schemas() {
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    let names: Vec<String> = reg.defs().into_iter().map(|d| d.name).collect();
    assert_eq!(
        names,
        [
            "workspace_list",
            "workspace_read",
            "workspace_write",
            "web_fetch",
            "run"
        ]
    );
    for d in reg.defs() {
        assert_eq!(d.parameters["type"], "object");
        assert_eq!(d.parameters["additionalProperties"], false);
    }
}

#[test]
fn arguments_are_parsed_into_the_tools_typed_arguments() {
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    let read = reg.get("workspace_read").unwrap();
    assert!(read.validate(&json!({"path": "/a"})).is_ok());
    let missing = read.validate(&json!({})).unwrap_err();
    assert!(missing.contains("missing field `path`"), "{missing}");
    let extra = read
        .validate(&json!({"path": "/a", "mode": 1}))
        .unwrap_err();
    assert!(extra.contains("mode"), "{extra}");
    let wrong = read.validate(&json!({"path": 7})).unwrap_err();
    assert!(wrong.contains("the argument \"path\""), "{wrong}");
    let fetch = reg.get("web_fetch").unwrap();
    assert!(
        fetch
            .validate(&json!({"url": "https://example.org/"}))
            .is_ok()
    );
    assert!(
        fetch
            .validate(&json!({"url": "http://example.org/"}))
            .is_err()
    );
    assert!(fetch.validate(&json!("https://x")).is_err());
}

#[test]
fn web_fetch_is_egress_limited_to_private_with_untrusted_public_output() {
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    let d = reg.get("web_fetch").unwrap().declared();
    assert_eq!(
        d.effect,
        Effect::Egress {
            max: DataClass::Private
        }
    );
    assert_eq!(d.reads, Reads::Fixed(DataClass::Public));
    assert!(d.untrusted_output);
    assert_eq!(d.approval, ApprovalRule::Never);
}

#[test]
fn web_fetch_is_offered_only_while_a_gateway_is_configured() {
    let names = |env: &Env| -> Vec<String> {
        let reg = Registry::new(&BTreeMap::new()).unwrap().offered(env);
        reg.defs().into_iter().map(|d| d.name).collect()
    };
    assert!(!names(&Env::default()).contains(&"web_fetch".to_string()));
    let with = Env {
        gateway: Some("/run/boxmaker/broker-gateway/gateway.sock".into()),
        ..Env::default()
    };
    assert!(names(&with).contains(&"web_fetch".to_string()));
    assert!(
        Registry::new(&BTreeMap::new())
            .unwrap()
            .offered(&Env::default())
            .get("web_fetch")
            .is_none()
    );
}

#[test]
fn web_fetch_run_without_a_gateway_fails_saying_so() {
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    let e = reg.get("web_fetch").unwrap();
    let args = json!({"url": "https://example.org/"});
    let plan = e.plan(&args, &Env::default()).unwrap();
    let err = e
        .run(
            &args,
            &plan,
            &Env::default(),
            &bxcore::SessionId::new("s").unwrap(),
        )
        .unwrap_err();
    assert_eq!(err.to_string(), "no gateway is configured");
}

#[test]
fn a_disabled_tool_is_neither_offered_nor_found() {
    let reg = Registry::new(&tight(
        "web_fetch",
        Tightening {
            enabled: Some(false),
            ..Default::default()
        },
    ))
    .unwrap();
    assert!(reg.get("web_fetch").is_none());
    assert!(reg.defs().iter().all(|d| d.name != "web_fetch"));
}

#[test]
fn tightening_raises_reads_trust_and_approval() {
    let reg = Registry::new(&tight(
        "web_fetch",
        Tightening {
            reads: Some(DataClass::Secret),
            approval: Some(ApprovalRule::Always),
            ..Default::default()
        },
    ))
    .unwrap();
    let e = reg.get("web_fetch").unwrap();
    assert_eq!(e.declared().reads, Reads::Fixed(DataClass::Secret));
    assert_eq!(e.declared().approval, ApprovalRule::Always);

    let reg = Registry::new(&tight(
        "workspace_read",
        Tightening {
            reads: Some(DataClass::Secret),
            untrusted_output: Some(true),
            ..Default::default()
        },
    ))
    .unwrap();
    let dir = tempfile::TempDir::new().unwrap();
    let env = Env {
        roots: toolkit::Roots::new(vec![toolkit::Root {
            path: dir.path().to_path_buf(),
            name: None,
            class: DataClass::Private,
            writable: false,
            untrusted: false,
        }])
        .unwrap(),
        gateway: None,
        run: None,
        servers: Default::default(),
    };
    let plan = reg
        .get("workspace_read")
        .unwrap()
        .plan(
            &json!({"path": dir.path().join("a").display().to_string()}),
            &env,
        )
        .unwrap();
    assert_eq!(plan.carries.class, DataClass::Secret);
    assert!(plan.carries.untrusted);
}

#[test]
fn loosening_is_refused() {
    let lower_reads = Registry::new(&tight(
        "web_fetch",
        Tightening {
            reads: Some(DataClass::Public),
            ..Default::default()
        },
    ));
    assert!(lower_reads.is_ok(), "public is what web_fetch declares");
    let trust = Registry::new(&tight(
        "web_fetch",
        Tightening {
            untrusted_output: Some(false),
            ..Default::default()
        },
    ))
    .unwrap_err();
    assert_eq!(trust, TighteningError::TrustsUntrusted("web_fetch".into()));
    assert!(trust.to_string().contains("can only tighten"));
    let always = tight(
        "web_fetch",
        Tightening {
            approval: Some(ApprovalRule::Always),
            ..Default::default()
        },
    );
    assert!(Registry::new(&always).is_ok());
}

#[test]
fn a_tightening_for_an_unknown_tool_is_refused() {
    let e = Registry::new(&tight("shell", Tightening::default())).unwrap_err();
    assert_eq!(e, TighteningError::UnknownTool("shell".into()));
    assert!(e.to_string().contains("there is no tool named \"shell\""));
}
