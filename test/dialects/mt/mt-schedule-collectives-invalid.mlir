// RUN: megatron-opt %s -split-input-file -verify-diagnostics -mt-schedule-collectives=cost-model=%t.missing
// RUN: megatron-opt %s -split-input-file -verify-diagnostics -mt-print-overlap=cost-model=%t.missing
// RUN: echo '{"device": {"kernel_launch_us": 0}}' > %t.json
// RUN: not megatron-opt %s -mt-schedule-collectives=cost-model=%t.json 2>&1 | FileCheck %s --check-prefix=KEY

// A cost model that cannot be read is an error naming the file, and a bad
// one names the key.
// expected-error@below {{cannot read the cost model}}
module {
}

// KEY: the cost model's 'device.kernel_launch_us' is 0.000000; expected a number above 0 (see data/cost-model.json)
