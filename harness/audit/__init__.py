"""``dpeval audit``: the white-box canary audit of a defense's release path (driver, terminal format)."""
