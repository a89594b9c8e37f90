//! End-to-end tests of alloctrace live in `tests/tests/`.
