package testimage

// The data-science variant (Options.DataScience) adds the Python stack of a
// data-science agent, as Debian packages it for the image's python3, to the
// default recipe: what the conformance suite runs numpy's and pandas' own
// tests and its workloads (multiprocessing, scikit-learn with joblib's
// loky, matplotlib, OpenBLAS) with. Debian ships each library's tests in
// its package (numpy/core/tests, pandas/tests, scipy/*/tests,
// sklearn/tests); pytest runs them, and the conftest.py of numpy and of
// pandas imports hypothesis. debootstrap adds what they depend on
// (OpenBLAS or the reference BLAS, joblib, threadpoolctl, Pillow, ...).
var dataSciencePackages = []string{
	"python3-numpy",
	"python3-pandas",
	"python3-scipy",
	"python3-sklearn",
	"python3-matplotlib",
	"python3-pytest",
	"python3-hypothesis",
	// numpy's and scipy's BLAS: Debian's default is the reference BLAS
	// (libblas3); the SVD figures of docs/PERFORMANCE.md are OpenBLAS's threads.
	"libopenblas0-pthread",
}

// DistPackagesDir is where the data-science variant's tree has Debian's
// Python packages (numpy/, pandas/, ...; their tests below them), relative
// to the root.
const DistPackagesDir = "usr/lib/python3/dist-packages"
