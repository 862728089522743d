"""systemd: the notify socket and the units."""
