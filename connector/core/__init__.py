"""What every package uses: source records, the ordering rule, errors, fault points and
configuration. It imports no other part of the product."""
