//! The example simulators (`examples/amplification`, `examples/overload`) on reduced runs.

mod amplification;
mod overload;
