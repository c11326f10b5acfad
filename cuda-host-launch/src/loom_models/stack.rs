//! The intrusive stack (`support/intrusive_stack.rs`), the library's own, on loom's atomics:
//! producers push while consumers take everything at once.

use super::*;

#[test]
fn loom_two_producers_push_while_a_consumer_takes() {
    check(
        "stack: 2 producers x 2 pushes, 1 consumer x 2 takes",
        3,
        || {
            let stack = new_stack();
            let producers = [producer(&stack, 0, 2), producer(&stack, 1, 2)];
            let taker = consumer(&stack, 2);
            let pushes: Vec<_> = producers.map(|h| h.join().unwrap()).into();
            let taken = taker.join().unwrap();
            verify(&pushes, &[taken], &take_batch(&stack));
        },
    );
}

#[test]
fn loom_three_producers_push_while_a_consumer_takes() {
    check(
        "stack: 3 producers x 1 push, 1 consumer x 1 take",
        3,
        || {
            let stack = new_stack();
            let producers = [
                producer(&stack, 0, 1),
                producer(&stack, 1, 1),
                producer(&stack, 2, 1),
            ];
            let taker = consumer(&stack, 1);
            let pushes: Vec<_> = producers.map(|h| h.join().unwrap()).into();
            let taken = taker.join().unwrap();
            verify(&pushes, &[taken], &take_batch(&stack));
        },
    );
}

#[test]
fn loom_two_consumers_take_concurrently() {
    check(
        "stack: 2 producers x 2 pushes, 2 consumers x 1 take",
        2,
        || {
            let stack = new_stack();
            let producers = [producer(&stack, 0, 2), producer(&stack, 1, 2)];
            let takers = [consumer(&stack, 1), consumer(&stack, 1)];
            let pushes: Vec<_> = producers.map(|h| h.join().unwrap()).into();
            let taken: Vec<_> = takers.map(|h| h.join().unwrap()).into();
            verify(&pushes, &taken, &take_batch(&stack));
        },
    );
}
