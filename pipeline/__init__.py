"""forumpulse."""
