//! plinth-builder: builds turn an environment's source into a layer: its files plus what its
//! manifests install, installed at the mount path sessions will see, in isolation.
