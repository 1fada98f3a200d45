"""Program features for learned cost models: Ansor's 164 per-statement features and a caching extractor."""

from tensorgen.features.ansor import statement_features
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.features.layout import N_FEATURES, NAMES

__all__ = ["N_FEATURES", "NAMES", "FeatureExtractor", "statement_features"]
