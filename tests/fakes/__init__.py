"""Small local servers that speak providers' wire formats, for the real client libraries."""
