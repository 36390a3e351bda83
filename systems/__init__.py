"""Memory systems behind one protocol (see DESIGN.md)."""
