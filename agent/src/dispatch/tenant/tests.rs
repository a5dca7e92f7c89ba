//! The book alone, with explicit times: rates, order, standby slots.

use super::*;

const MS: Duration = Duration::from_millis(1);

fn spec(name: &str, models: &[&str], priority: u32, share: f64, rate: Option<f64>) -> TenantSpec {
    TenantSpec {
        name: name.into(),
        models: models.iter().map(|m| m.to_string()).collect(),
        priority,
        share,
        rate,
        default_request_priority: DEFAULT_REQUEST_PRIORITY,
    }
}

/// high (priority 1, half the node) and low (priority 20, the rest).
fn two() -> Book {
    Book::new(Tenants::new(vec![
        spec("high", &["hi"], 1, 0.5, None),
        spec("low", &["lo"], 20, 0.5, None),
    ]))
}

#[test]
fn models_belong_to_their_tenant_and_the_rest_to_default() {
    let t = Tenants::new(vec![spec("high", &["hi"], 1, 0.5, None)]);
    assert_eq!(t.len(), 2);
    assert_eq!(t.spec(t.of("hi")).name, "high");
    assert_eq!(t.spec(t.of("anything")).name, "default");
    assert!(Tenants::default().trivial());
    assert_eq!(Tenants::default().spec(0).share, 1.0);
}

#[test]
fn a_rate_admits_a_second_of_burst_then_one_per_interval() {
    let mut b = Book::new(Tenants::new(vec![spec("r", &["m"], 10, 0.0, Some(2.0))]));
    let t0 = Instant::now();
    assert_eq!(b.arrive(0, t0), Ok(()));
    assert_eq!(b.arrive(0, t0), Ok(()));
    let wait = b.arrive(0, t0).unwrap_err();
    assert_eq!(wait, MS * 500, "half a second to the next token");
    assert_eq!(b.arrive(0, t0 + MS * 500), Ok(()));
    assert!(b.arrive(0, t0 + MS * 500).is_err());
    assert_eq!(b.stats()[0].shed, [0, 2, 0]);
    // No rate: always admitted.
    assert_eq!(b.arrive(1, t0), Ok(()));
}

#[test]
fn below_share_then_priority_then_usage_then_the_request_then_arrival() {
    let mut b = two();
    let slots = 4.0;
    // Both idle: high (priority 1) before low, whatever arrived first.
    assert!(b.precedence(0, slots, 10, 9) < b.precedence(1, slots, 10, 1));
    // High at its share (2 of 4) borrows; low below it goes first.
    b.dispatched(0);
    b.dispatched(0);
    assert!(b.borrowing(0, slots) && !b.borrowing(1, slots));
    assert!(b.precedence(1, slots, 10, 9) < b.precedence(0, slots, 10, 1));
    // Within a tenant: the request's level, then arrival.
    assert!(b.precedence(1, slots, 1, 9) < b.precedence(1, slots, 10, 1));
    assert!(b.precedence(1, slots, 10, 1) < b.precedence(1, slots, 10, 2));
    // Same priority: the one using less of its share first.
    let mut b = Book::new(Tenants::new(vec![
        spec("a", &["a"], 5, 0.5, None),
        spec("b", &["b"], 5, 0.25, None),
    ]));
    b.dispatched(0);
    b.dispatched(0);
    b.dispatched(1);
    // Both borrowing at 8 slots? a uses 2/4, b 1/2: equal; give b one more.
    b.dispatched(1);
    assert!(b.precedence(0, 8.0, 10, 2) < b.precedence(1, 8.0, 10, 1));
}

#[test]
fn an_active_tenant_below_its_share_has_a_standby_slot_until_it_is_quiet() {
    let mut b = two();
    let slots = 4.0;
    let t0 = Instant::now();
    // High never came: nothing kept for it.
    assert_eq!(b.standby(0, slots, t0), 0);
    // High sent a request just now (answered): one slot.
    assert_eq!(b.arrive(0, t0), Ok(()));
    assert_eq!(b.standby(0, slots, t0), STANDBY_SLOTS);
    // Quiet for IDLE_AFTER: none.
    assert_eq!(b.standby(0, slots, t0 + IDLE_AFTER), 0);
    // In flight or queued counts as active whatever the time.
    b.waiting(0, true);
    assert_eq!(b.standby(0, slots, t0 + IDLE_AFTER * 10), STANDBY_SLOTS);
    // At its share (2 of 4), high needs none.
    b.waiting(0, false);
    b.dispatched(0);
    b.dispatched(0);
    assert_eq!(b.standby(0, slots, t0 + IDLE_AFTER * 10), 0);
    // A tenant without a share never has one.
    let mut b = Book::new(Tenants::new(vec![spec("high", &["hi"], 1, 1.0, None)]));
    assert_eq!(b.arrive(1, t0), Ok(()));
    assert_eq!(b.tenants().spec(1).share, 0.0);
    assert_eq!(b.standby(1, slots, t0), 0);
}

#[test]
fn one_tenant_is_plain_fifo_with_the_whole_node() {
    let mut b = Book::new(Tenants::default());
    let t0 = Instant::now();
    for _ in 0..10 {
        b.dispatched(0);
    }
    assert_eq!(b.arrive(0, t0), Ok(()));
    assert_eq!(b.standby(0, 4.0, t0), 0, "at its share (all of it)");
    assert!(b.precedence(0, 4.0, 10, 1) < b.precedence(0, 4.0, 10, 2));
    assert_eq!(request_level(None, 10), 10);
    assert_eq!(request_level(Some(0), 2), 2);
    assert_eq!(request_level(Some(3), 10), 3);
}
