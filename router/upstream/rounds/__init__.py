"""A backend's questions of the client carried across the protocol eras: input-required rounds for
a 2026-07-28 client (`input_rounds`), questions on a call's stream for a handshake-era one
(`stream_rounds`)."""
