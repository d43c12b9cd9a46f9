"""What autotune knows by name, once: GPU models (``devices``), model profiles
(``profiles``) and the tasks a submitted job may train (``tasks``)."""
