"""The rule a sample id shares between a team's table (unlearning/data/sources.py refuses such ids at load)
and a deletion request (unlearning/requests.py refuses them in a request): an id that the one allows and the
other refuses would be trained on and could never be erased."""

from __future__ import annotations

import re

# a line break, tab or other control character: an id (or a reason) is one line of text
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
