"""TensorFlow's C++ start-up lines on stderr (absl's notice, INFO lines): what the CLI hides unless -v."""

import re

TF_NOISE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\)|I\d{4} .*\] )", re.M)
