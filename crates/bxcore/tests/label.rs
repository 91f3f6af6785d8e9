//! The label is a lattice: join is its least upper bound, and a label only rises.

use bxcore::{DataClass, Label};
use proptest::prelude::*;

fn class() -> impl Strategy<Value = DataClass> {
    prop_oneof![
        Just(DataClass::Public),
        Just(DataClass::Private),
        Just(DataClass::Secret)
    ]
}

fn label() -> impl Strategy<Value = Label> {
    (class(), any::<bool>()).prop_map(|(c, u)| Label::new(c, u))
}

proptest! {
    #[test]
    fn join_is_commutative_associative_and_idempotent(a in label(), b in label(), c in label()) {
        prop_assert_eq!(a.join(b), b.join(a));
        prop_assert_eq!(a.join(b).join(c), a.join(b.join(c)));
        prop_assert_eq!(a.join(a), a);
    }

    #[test]
    fn bottom_is_the_identity_and_join_is_the_least_upper_bound(a in label(), b in label(), u in label()) {
        prop_assert_eq!(a.join(Label::BOTTOM), a);
        let j = a.join(b);
        prop_assert!(a.flows_to(j) && b.flows_to(j));
        // Any upper bound of both is above the join.
        if a.flows_to(u) && b.flows_to(u) {
            prop_assert!(j.flows_to(u));
        }
    }

    #[test]
    fn raise_only_rises_and_says_when_it_changed(a in label(), b in label()) {
        let mut r = a;
        let changed = r.raise(b);
        prop_assert!(a.flows_to(r));
        prop_assert_eq!(r, a.join(b));
        prop_assert_eq!(changed, r != a);
    }

    #[test]
    fn flows_to_is_a_partial_order(a in label(), b in label(), c in label()) {
        prop_assert!(a.flows_to(a));
        if a.flows_to(b) && b.flows_to(a) {
            prop_assert_eq!(a, b);
        }
        if a.flows_to(b) && b.flows_to(c) {
            prop_assert!(a.flows_to(c));
        }
    }
}

#[test]
fn a_fresh_session_is_private_and_trusted_and_its_wire_form_is_class_and_untrusted() {
    assert_eq!(Label::FRESH, Label::new(DataClass::Private, false));
    assert_eq!(
        serde_json::to_string(&Label::new(DataClass::Secret, true)).unwrap(),
        r#"{"class":"secret","untrusted":true}"#
    );
    assert!(serde_json::from_str::<Label>(r#"{"class":"secret","untrusted":true,"x":1}"#).is_err());
}
