"""The machine layer: what hardware this is, which precision and backend flags it supports, processes."""
