"""Generated protobuf code (see proto/ and `nox -s proto`); do not edit."""
