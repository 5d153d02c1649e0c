"""Machine-learning training on a CIFAR-10-shaped synthetic set (32x32x3 images, 10 classes):
scikit-learn's multi-layer perceptron, a fixed seed, single-threaded BLAS for a deterministic
result. The paper trained TensorFlow on CIFAR-10; this is the same shape of work."""
import sys

import numpy as np
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 8
rng = np.random.default_rng(7)
centers = rng.normal(0, 1, size=(10, 3072)).astype(np.float32)
y = rng.integers(0, 10, size=n)
X = (centers[y] + rng.normal(0, 4.0, size=(n, 3072))).astype(np.float32)
Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=0)
clf = MLPClassifier(hidden_layer_sizes=(512, 128), max_iter=epochs, random_state=0, batch_size=128)
import warnings
warnings.filterwarnings("ignore")
clf.fit(Xtr, ytr)
print(f"samples={n} epochs={epochs} train_acc={clf.score(Xtr, ytr):.4f} test_acc={clf.score(Xte, yte):.4f}")
