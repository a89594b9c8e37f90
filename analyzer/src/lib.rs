//! alloctrace's analyzer: reads traces (and foreign formats), replays them, computes and renders.

pub mod import;
