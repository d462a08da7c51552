pub mod placement;
