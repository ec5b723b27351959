// RUN: megatron-opt %s -verify-diagnostics '-mt-annotate-shardings=context-parallel-size=2 cp-comm-type=a2a'

// The exchanges of keys and values are Megatron-LM's p2p (the ring) and
// all_gather; another name is refused rather than run as one of them.

// expected-error @below {{mt-annotate-shardings: cp-comm-type 'a2a' is not an exchange of keys and values here; use p2p (the ring) or all_gather}}
module {
}
