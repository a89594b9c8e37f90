//! The simulated device. (Being written.)

/// A capacity-limited device with deterministic addresses.
#[derive(Debug, Default)]
pub struct SimDevice;
