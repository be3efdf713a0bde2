use super::*;
use crate::consumer::task_keys::holding::RETRY;
use crate::consumer::task_keys::script::Kind;

const TTL: Duration = Duration::from_secs(3);

fn waiting(waiters: u32) -> Key {
    let mut key = Key::default();
    key.waiting(waiters as isize);
    key
}

fn per_second(n: u32) -> Option<RateLimit> {
    Some(RateLimit::new(n, Duration::from_secs(1)))
}

#[test]
fn a_waiting_task_asks_for_a_unit_with_a_cushion_and_starts_once_granted() {
    let now = Instant::now();
    let mut key = Key::default();
    assert!(!key.take(now, true, None), "nothing held yet");
    key.waiting(4 - key.waiters as isize);
    // Four wait: four, and half as many again.
    assert_eq!(key.units_op(now, Some(100), false), Some((0, 6)));
    assert!(
        key.granted(Kind::Units, now, TTL, (6, 6), None),
        "the waiting may start"
    );
    key.waiting(0 - key.waiters as isize);
    for _ in 0..6 {
        assert!(key.take(now, true, None));
    }
    assert!(!key.take(now, true, None), "six units, six tasks");
}

#[test]
fn what_the_limit_leaves_is_asked_for_again_after_the_retry_not_before() {
    let now = Instant::now();
    let mut key = waiting(2);
    assert_eq!(key.units_op(now, Some(2), false), Some((0, 2)));
    assert!(!key.granted(Kind::Units, now, TTL, (2, 0), None), "refused");
    assert_eq!(key.units_op(now + RETRY / 2, Some(2), false), None);
    assert_eq!(key.next_look(now, None), Some(now + RETRY));
    assert_eq!(key.units_op(now + RETRY, Some(2), false), Some((0, 2)));
}

#[test]
fn a_surplus_goes_back_after_the_linger_and_down_to_the_share_when_wanted_elsewhere() {
    let now = Instant::now();
    let mut key = waiting(2);
    key.units_op(now, Some(100), false);
    key.granted(Kind::Units, now, TTL, (3, 3), None);
    key.waiting(0 - key.waiters as isize);
    assert!(key.take(now, true, None));
    assert!(!key.end(), "nobody else is short");
    // The look sizes the count by the most needed since the last: still 3.
    assert_eq!(key.units_op(now, Some(100), false), None);
    assert_eq!(key.next_look(now, None), None);
    // Nothing runs: the three units idle, and go back only after LINGER.
    assert_eq!(key.units_op(now, Some(100), false), None);
    assert_eq!(key.next_look(now, None), Some(now + LINGER));
    assert_eq!(key.units_op(now + LINGER, Some(100), false), Some((0, 0)));
    assert!(
        !key.take(now + LINGER, true, None),
        "lowered before it is sent"
    );
    // Another instance is short: the even share of 2 is 1.
    let mut key = waiting(1);
    key.units_op(now, Some(2), false);
    key.granted(Kind::Units, now, TTL, (2, 2), Some(1));
    key.waiting(3 - key.waiters as isize);
    assert!(key.take(now, true, None));
    assert!(key.take(now, true, None));
    assert_eq!(key.units_op(now, Some(2), false), None, "both in use");
    assert!(key.end(), "the leaser looks at once");
    // Given back down to the share, though tasks wait here.
    assert_eq!(key.units_op(now, Some(2), false), Some((1, 1)));
    assert!(!key.take(now, true, None), "lowered before it is sent");
}

#[test]
fn what_is_held_is_kept_and_not_used_past_its_lapse() {
    let now = Instant::now();
    let mut key = waiting(1);
    key.units_op(now, Some(10), false);
    key.granted(Kind::Units, now, TTL, (2, 2), None);
    key.waiting(0 - key.waiters as isize);
    assert!(key.take(now, true, None));
    assert_eq!(key.units_op(now, Some(10), true), Some((2, 2)), "a keep");
    // Not confirmed since: after the lapse no task starts with them.
    assert!(!key.take(now + TTL, true, None));
    key.granted(Kind::Rate, now, TTL, (100, 100), None);
    assert!(key.take(now, false, per_second(100)));
    assert!(
        !key.take(now + TTL, false, per_second(100)),
        "the share too"
    );
}

#[test]
fn a_lowered_limit_is_followed_at_once() {
    let now = Instant::now();
    let mut key = waiting(20);
    key.units_op(now, Some(100), false);
    key.granted(Kind::Units, now, TTL, (30, 30), None);
    assert_eq!(key.units_op(now, Some(5), false), Some((5, 5)));
    key.rate_op(now, per_second(1_000), false);
    key.granted(Kind::Rate, now, TTL, (1_000, 1_000), None);
    assert_eq!(key.rate_op(now, per_second(10), false), Some((10, 10)));
}

#[test]
fn a_busy_key_asks_for_the_whole_rate_and_starts_at_its_share() {
    let now = Instant::now();
    let rate = per_second(100);
    let mut key = waiting(1);
    assert!(!key.take(now, false, rate), "no share yet");
    assert_eq!(key.rate_op(now, rate, false), Some((0, 100)));
    assert!(key.granted(Kind::Rate, now, TTL, (100, 100), None));
    // A burst of 30 ms of the share (3 starts), then one every 10 ms.
    for _ in 0..3 {
        assert!(key.take(now, false, rate));
    }
    assert!(!key.take(now, false, rate));
    key.waiting(1 - key.waiters as isize);
    let due = key.next_look(now, rate).expect("a start is due");
    assert!(
        due > now && due <= now + Duration::from_millis(10),
        "{:?}",
        due - now
    );
    assert!(key.due(due, false, rate), "told when its start is due");
    assert!(key.take(due, false, rate));
}

#[test]
fn a_share_goes_back_once_the_key_is_idle_and_to_an_even_share_when_wanted() {
    let now = Instant::now();
    let rate = per_second(100);
    let mut key = waiting(1);
    key.rate_op(now, rate, false);
    key.granted(Kind::Rate, now, TTL, (100, 100), None);
    key.waiting(0 - key.waiters as isize);
    assert!(key.take(now, false, rate));
    assert!(key.holds_rate());
    assert_eq!(key.rate_op(now, rate, false), None, "busy");
    let idle = now + LINGER;
    assert_eq!(key.rate_op(idle, rate, false), None, "idle from now");
    assert_eq!(key.rate_op(idle + LINGER, rate, false), Some((0, 0)));
    // Another instance is short: down to the even share at once.
    let mut key = waiting(5);
    key.rate_op(now, rate, false);
    key.granted(Kind::Rate, now, TTL, (100, 100), Some(50));
    assert_eq!(key.rate_op(now, rate, false), Some((50, 50)));
}

#[test]
fn a_key_is_forgotten_only_once_redis_holds_nothing_of_it_here() {
    let now = Instant::now();
    let mut key = waiting(1);
    key.units_op(now, Some(1), false);
    // Refused, and recorded short: the field is there.
    key.granted(Kind::Units, now, TTL, (1, 0), None);
    key.waiting(0 - key.waiters as isize);
    assert!(!key.forgettable());
    // Asked again for the task that waited since the last look, and
    // refused; then nothing is needed any more, and the field goes.
    assert_eq!(key.units_op(now + RETRY, Some(1), false), Some((0, 1)));
    key.granted(Kind::Units, now + RETRY, TTL, (1, 0), None);
    assert_eq!(key.units_op(now + RETRY, Some(1), true), Some((0, 0)));
    key.granted(Kind::Units, now + RETRY, TTL, (0, 0), None);
    assert!(key.forgettable());
}
