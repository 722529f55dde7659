"""``python -m forumpulse.pipeline.native``: build the scanner now and say whether it loaded (``make install``)."""

from forumpulse.pipeline.native import status

print("forumpulse native scanner:", status())
