//! alloctrace's analyzer: reads traces (and foreign formats), replays them through the
//! recorder's engine on a simulated device, computes and renders.

pub mod category;
pub mod cmd;
pub mod diff;
pub mod explain;
pub mod frag;
pub mod import;
pub mod leaks;
pub mod model;
pub mod plot;
pub mod progress;
pub mod ranks;
pub mod replay;
pub mod report;
pub mod summary;
pub mod synth;
pub mod timeline;
pub mod tracefile;
pub mod units;
pub mod whatif;
