package containment

// What the package's external tests (package containment_test) reach of its insides.

// SealedWork and SealedCapsule are where a sealed session finds its workdir and capsule.
const (
	SealedWork    = sealedWork
	SealedCapsule = sealedCapsule
)
