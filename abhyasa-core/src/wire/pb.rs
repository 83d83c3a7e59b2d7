//! The protobuf types of `spec/abhyasa.proto`, generated at build time
//! (`build.rs`, `protox` and `prost-build`).

include!(concat!(env!("OUT_DIR"), "/abhyasa.v1.rs"));
