"""PARQUET CASES GO HERE (scripts/data/fuzz_inputs.py): the place kept for
damaged Parquet inputs while the Parquet reader is written elsewhere."""


def parquet_case(c, rng):
    """The place kept for Parquet inputs (the Parquet reader is work in hand
    elsewhere): wrong column type (int64 or binary where the text is a
    string), the text column missing, a truncated footer, bad UTF-8 in a
    string column, a row group cut short. Fill in with pyarrow-written files
    once adgt-data reads Parquet; until then no case is made (None) and the
    class takes no turns."""
    return None
