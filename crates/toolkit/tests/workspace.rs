//! Paths beneath their roots: what stays inside is served, what leaves is refused, whatever the
//! path's words say.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use bxcore::DataClass;
use serde_json::json;
use tempfile::TempDir;
use toolkit::{Effect, Env, Registry, Root, Roots, ToolError};

struct Box_ {
    _home: TempDir,
    notes: String,
    secret: String,
    outside: String,
    env: Env,
    reg: Registry,
}

fn setup() -> Box_ {
    let home = TempDir::new().unwrap();
    let base = home.path().canonicalize().unwrap();
    let notes = base.join("notes");
    let secret = base.join("secret");
    let outside = base.join("outside");
    for d in [&notes, &secret, &outside] {
        fs::create_dir(d).unwrap();
    }
    fs::write(notes.join("a.txt"), "hello").unwrap();
    fs::create_dir(notes.join("sub")).unwrap();
    fs::write(notes.join("sub/b.txt"), "bee").unwrap();
    fs::write(secret.join("key.txt"), "s3cret").unwrap();
    fs::write(outside.join("x.txt"), "not yours").unwrap();
    let roots = Roots::new(vec![
        Root {
            path: notes.clone(),
            name: None,
            class: DataClass::Private,
            writable: true,
            untrusted: false,
        },
        Root {
            path: secret.clone(),
            name: None,
            class: DataClass::Secret,
            writable: false,
            untrusted: true,
        },
    ])
    .unwrap();
    Box_ {
        notes: notes.display().to_string(),
        secret: secret.display().to_string(),
        outside: outside.display().to_string(),
        _home: home,
        env: Env {
            roots,
            gateway: None,
            run: None,
            servers: Default::default(),
        },
        reg: Registry::new(&Default::default()).unwrap(),
    }
}

fn read(b: &Box_, path: &str) -> Result<String, ToolError> {
    let e = b.reg.get("workspace_read").unwrap();
    let args = json!({ "path": path });
    e.validate(&args).unwrap();
    let plan = e.plan(&args, &b.env)?;
    e.run(&args, &plan, &b.env, &bxcore::SessionId::new("s").unwrap())
        .map(|o| o.content)
}

fn refused_as_leaving(r: Result<String, ToolError>) {
    match r {
        Err(ToolError::Refused(m)) => assert!(m.contains("leads out of the workspace root"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_file_inside_its_root_is_read_with_the_roots_class() {
    let b = setup();
    assert_eq!(read(&b, &format!("{}/a.txt", b.notes)).unwrap(), "hello");
    let e = b.reg.get("workspace_read").unwrap();
    let plan = e
        .plan(&json!({"path": format!("{}/key.txt", b.secret)}), &b.env)
        .unwrap();
    assert_eq!(plan.carries.class, DataClass::Secret);
    assert!(plan.carries.untrusted);
    assert_eq!(plan.effect, Effect::None);
}

#[test]
fn a_path_outside_every_root_is_refused() {
    let b = setup();
    match read(&b, &format!("{}/x.txt", b.outside)) {
        Err(ToolError::Refused(m)) => assert!(m.contains("is not in any workspace root"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn dot_dot_that_leaves_its_root_is_refused() {
    let b = setup();
    refused_as_leaving(read(&b, &format!("{}/sub/../../outside/x.txt", b.notes)));
}

#[test]
fn dot_dot_that_stays_inside_is_fine() {
    let b = setup();
    assert_eq!(
        read(&b, &format!("{}/sub/../a.txt", b.notes)).unwrap(),
        "hello"
    );
}

#[test]
fn an_absolute_symlink_is_refused_even_into_its_own_root() {
    let b = setup();
    symlink(
        format!("{}/x.txt", b.outside),
        format!("{}/abs-out", b.notes),
    )
    .unwrap();
    symlink(format!("{}/a.txt", b.notes), format!("{}/abs-in", b.notes)).unwrap();
    refused_as_leaving(read(&b, &format!("{}/abs-out", b.notes)));
    refused_as_leaving(read(&b, &format!("{}/abs-in", b.notes)));
}

#[test]
fn a_relative_symlink_that_leads_out_is_refused() {
    let b = setup();
    symlink("../outside/x.txt", format!("{}/rel-out", b.notes)).unwrap();
    symlink("../../outside", format!("{}/sub/dir-out", b.notes)).unwrap();
    refused_as_leaving(read(&b, &format!("{}/rel-out", b.notes)));
    refused_as_leaving(read(&b, &format!("{}/sub/dir-out/x.txt", b.notes)));
}

#[test]
fn a_relative_symlink_that_stays_inside_is_followed() {
    let b = setup();
    symlink("../a.txt", format!("{}/sub/up", b.notes)).unwrap();
    assert_eq!(read(&b, &format!("{}/sub/up", b.notes)).unwrap(), "hello");
}

#[test]
fn a_relative_path_that_names_a_root_is_taken_in_that_root() {
    let b = setup();
    assert_eq!(read(&b, "notes/a.txt").unwrap(), "hello");
    assert_eq!(read(&b, "notes/sub/b.txt").unwrap(), "bee");
    assert_eq!(read(&b, "secret/key.txt").unwrap(), "s3cret");
}

#[test]
fn any_other_relative_path_is_taken_in_the_first_root() {
    let b = setup();
    assert_eq!(read(&b, "a.txt").unwrap(), "hello");
    assert_eq!(read(&b, "sub/b.txt").unwrap(), "bee");
    assert_eq!(read(&b, "./a.txt").unwrap(), "hello");
}

#[test]
fn a_root_name_wins_over_a_directory_of_that_name_in_the_first_root() {
    let b = setup();
    fs::create_dir(format!("{}/secret", b.notes)).unwrap();
    fs::write(format!("{}/secret/key.txt", b.notes), "not the vault").unwrap();
    assert_eq!(read(&b, "secret/key.txt").unwrap(), "s3cret");
}

#[test]
fn a_relative_path_is_labelled_by_the_root_it_reaches() {
    let b = setup();
    let e = b.reg.get("workspace_read").unwrap();
    let plan = e.plan(&json!({"path": "secret/key.txt"}), &b.env).unwrap();
    assert_eq!(plan.carries.class, DataClass::Secret);
    assert!(plan.carries.untrusted);
    let plan = e.plan(&json!({"path": "a.txt"}), &b.env).unwrap();
    assert_eq!(plan.carries.class, DataClass::Private);
}

#[test]
fn a_relative_path_cannot_climb_out_of_its_root() {
    let b = setup();
    refused_as_leaving(read(&b, "../outside/x.txt"));
    refused_as_leaving(read(&b, "notes/../secret/key.txt"));
    refused_as_leaving(read(&b, "sub/../../outside/x.txt"));
}

#[test]
fn with_no_root_a_relative_path_is_in_none() {
    let env = Env::default();
    let reg = Registry::new(&Default::default()).unwrap();
    let e = reg.get("workspace_read").unwrap();
    match e.plan(&json!({"path": "a.txt"}), &env) {
        Err(ToolError::Refused(m)) => assert!(m.contains("no workspace root"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn two_roots_may_not_share_a_name() {
    let root = |p: &str, name: Option<&str>| Root {
        path: p.into(),
        name: name.map(str::to_string),
        class: DataClass::Private,
        writable: false,
        untrusted: false,
    };
    let e = Roots::new(vec![root("/a/notes", None), root("/b/notes", None)]).unwrap_err();
    assert!(
        e.to_string()
            .contains("name \"notes\" is the name of two roots"),
        "{e}"
    );
    assert!(Roots::new(vec![root("/a/notes", None), root("/b/notes", Some("work"))]).is_ok());
    for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(65)] {
        assert!(
            Roots::new(vec![root("/a/n", Some(bad))]).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn a_missing_file_and_a_fifo_fail_without_blocking() {
    let b = setup();
    assert!(matches!(
        read(&b, &format!("{}/nope", b.notes)),
        Err(ToolError::Failed(_))
    ));
    nix::unistd::mkfifo(
        Path::new(&format!("{}/pipe", b.notes)),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    match read(&b, &format!("{}/pipe", b.notes)) {
        Err(ToolError::Failed(m)) => assert!(m.contains("not a regular file"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_listing_names_files_and_marks_directories() {
    let b = setup();
    let e = b.reg.get("workspace_list").unwrap();
    let list = |path: String| {
        let args = json!({ "path": path });
        let plan = e.plan(&args, &b.env).unwrap();
        e.run(&args, &plan, &b.env, &bxcore::SessionId::new("s").unwrap())
            .unwrap()
    };
    let out = list(b.notes.clone());
    assert_eq!(out.content, "a.txt\nsub/");
    let sub = list(format!("{}/sub/", b.notes));
    assert_eq!(sub.content, "b.txt");
}

fn write(b: &Box_, path: &str, content: &str) -> Result<String, ToolError> {
    let e = b.reg.get("workspace_write").unwrap();
    let args = json!({ "path": path, "content": content });
    e.validate(&args).unwrap();
    let plan = e.plan(&args, &b.env)?;
    e.run(&args, &plan, &b.env, &bxcore::SessionId::new("s").unwrap())
        .map(|o| o.content)
}

#[test]
fn a_write_replaces_the_file_whole_and_leaves_no_temporary() {
    let b = setup();
    let p = format!("{}/sub/new.txt", b.notes);
    assert_eq!(
        write(&b, &p, "one").unwrap(),
        format!("wrote 3 bytes to {p}")
    );
    write(&b, &p, "two!").unwrap();
    assert_eq!(fs::read_to_string(&p).unwrap(), "two!");
    let names: Vec<_> = fs::read_dir(format!("{}/sub", b.notes))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn a_write_plans_the_roots_class_as_its_destination() {
    let b = setup();
    let e = b.reg.get("workspace_write").unwrap();
    let plan = e
        .plan(
            &json!({"path": format!("{}/n.txt", b.notes), "content": "x"}),
            &b.env,
        )
        .unwrap();
    assert_eq!(plan.effect, Effect::Local);
    assert_eq!(plan.writes_into, Some(DataClass::Private));
}

#[test]
fn a_write_to_a_read_only_root_is_refused_and_writes_nothing() {
    let b = setup();
    let p = format!("{}/new.txt", b.secret);
    match write(&b, &p, "x") {
        Err(ToolError::Touched(labels, m)) => {
            assert!(m.contains("read-only"), "{m}");
            assert_eq!(labels.label.class, DataClass::Secret);
        }
        other => panic!("{other:?}"),
    }
    assert!(!Path::new(&p).exists());
}

#[test]
fn a_write_through_a_symlink_out_is_refused_and_the_target_is_untouched() {
    let b = setup();
    symlink("../outside", format!("{}/out", b.notes)).unwrap();
    let r = write(&b, &format!("{}/out/x.txt", b.notes), "owned");
    assert!(matches!(r, Err(ToolError::Refused(_))), "{r:?}");
    assert_eq!(
        fs::read_to_string(format!("{}/x.txt", b.outside)).unwrap(),
        "not yours"
    );
    let r = write(&b, &format!("{}/../outside/x.txt", b.notes), "owned");
    assert!(matches!(r, Err(ToolError::Refused(_))), "{r:?}");
    assert_eq!(
        fs::read_to_string(format!("{}/x.txt", b.outside)).unwrap(),
        "not yours"
    );
}

#[test]
fn a_write_over_a_symlink_replaces_the_link_not_its_target() {
    let b = setup();
    symlink(format!("{}/x.txt", b.outside), format!("{}/link", b.notes)).unwrap();
    write(&b, &format!("{}/link", b.notes), "mine").unwrap();
    assert_eq!(
        fs::read_to_string(format!("{}/x.txt", b.outside)).unwrap(),
        "not yours"
    );
    assert_eq!(
        fs::read_to_string(format!("{}/link", b.notes)).unwrap(),
        "mine"
    );
}

#[test]
fn a_write_to_the_root_itself_is_refused() {
    let b = setup();
    let r = write(&b, &b.notes.clone(), "x");
    assert!(matches!(r, Err(ToolError::Refused(_))), "{r:?}");
}

#[test]
fn roots_must_be_absolute_normal_and_listed_once() {
    let root = |p: &str| Root {
        path: p.into(),
        name: None,
        class: DataClass::Private,
        writable: false,
        untrusted: false,
    };
    assert!(Roots::new(vec![root("rel")]).is_err());
    assert!(Roots::new(vec![root("/a/../b")]).is_err());
    assert!(Roots::new(vec![root("/a"), root("/a")]).is_err());
    assert!(Roots::new(vec![root("/a"), root("/a/b")]).is_ok());
}

#[test]
fn nested_roots_give_the_deepest_roots_class() {
    let b = setup();
    let mut roots: Vec<Root> = b.env.roots.iter().cloned().collect();
    roots.push(Root {
        path: format!("{}/sub", b.notes).into(),
        name: None,
        class: DataClass::Secret,
        writable: false,
        untrusted: false,
    });
    let env = Env {
        roots: Roots::new(roots).unwrap(),
        gateway: None,
        run: None,
        servers: Default::default(),
    };
    let e = b.reg.get("workspace_read").unwrap();
    let plan = e
        .plan(&json!({"path": format!("{}/sub/b.txt", b.notes)}), &env)
        .unwrap();
    assert_eq!(plan.carries.class, DataClass::Secret);
}
