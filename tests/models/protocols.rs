//! The exhaustive models of three of the crate's protocols (the server's key protocol, the
//! relay and the inbox, the leased work queue), checked with `stateright`: each test runs the
//! check of the same name in `surely-protocols` (`tests/protocols`), a crate of the workspace
//! built optimised even in a debug build. What they prove: `docs::how_we_know`.

#[test]
fn key_protocol_holds_with_the_recovery_hook() {
    surely_protocols::key_protocol_holds_with_the_recovery_hook();
}

#[test]
fn key_protocol_holds_with_three_owners() {
    surely_protocols::key_protocol_holds_with_three_owners();
}

#[test]
fn key_protocol_holds_without_a_hook() {
    surely_protocols::key_protocol_holds_without_a_hook();
}

#[test]
fn key_mutant_without_the_fence_check() {
    surely_protocols::key_mutant_without_the_fence_check();
}

#[test]
fn key_mutant_calling_the_channel_before_the_checkpoint() {
    surely_protocols::key_mutant_calling_the_channel_before_the_checkpoint();
}

#[test]
fn key_mutant_rerunning_blindly_on_a_takeover() {
    surely_protocols::key_mutant_rerunning_blindly_on_a_takeover();
}

#[test]
fn key_mutant_releasing_a_dropped_handler_after_its_checkpoint() {
    surely_protocols::key_mutant_releasing_a_dropped_handler_after_its_checkpoint();
}

#[test]
fn key_settling_by_asking_alone_charges_twice() {
    surely_protocols::key_settling_by_asking_alone_charges_twice();
}

#[test]
fn key_a_channel_without_request_ids_charges_twice() {
    surely_protocols::key_a_channel_without_request_ids_charges_twice();
}

#[test]
fn relay_and_inbox_hold() {
    surely_protocols::relay_and_inbox_hold();
}

#[test]
fn relay_and_inbox_hold_with_two_consumers() {
    surely_protocols::relay_and_inbox_hold_with_two_consumers();
}

#[test]
fn relay_and_inbox_hold_with_two_crashes_each() {
    surely_protocols::relay_and_inbox_hold_with_two_crashes_each();
}

#[test]
fn relay_mutant_acknowledging_before_the_commit() {
    surely_protocols::relay_mutant_acknowledging_before_the_commit();
}

#[test]
fn relay_mutant_recording_in_a_second_transaction() {
    surely_protocols::relay_mutant_recording_in_a_second_transaction();
}

#[test]
fn relay_mutant_marking_before_publishing() {
    surely_protocols::relay_mutant_marking_before_publishing();
}

#[test]
fn queue_protocol_holds() {
    surely_protocols::queue_protocol_holds();
}

#[test]
fn queue_protocol_holds_in_the_outboxs_shape() {
    surely_protocols::queue_protocol_holds_in_the_outboxs_shape();
}

#[test]
fn queue_mutant_without_the_fence_check() {
    surely_protocols::queue_mutant_without_the_fence_check();
}

#[test]
fn queue_mutant_claiming_a_held_lease() {
    surely_protocols::queue_mutant_claiming_a_held_lease();
}

#[test]
fn queue_mutant_claiming_the_manual_state() {
    surely_protocols::queue_mutant_claiming_the_manual_state();
}

#[test]
fn queue_mutant_sweeping_manual_rows() {
    surely_protocols::queue_mutant_sweeping_manual_rows();
}

#[test]
fn queue_mutant_reopening_without_a_new_fence() {
    surely_protocols::queue_mutant_reopening_without_a_new_fence();
}

#[test]
fn the_models_have_no_cycles() {
    surely_protocols::the_models_have_no_cycles();
}
