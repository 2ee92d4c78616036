// Kroxylicious (io.kroxylicious:kroxylicious-runtime), the Kafka community's proxy, started from its YAML
// configuration with no filters and listening on 127.0.0.1 only: the reference proxy of `tiering bench proxy`.
// Its gateways of 0.12 ("portIdentifiesNode") bind every interface and have no setting for the address; the
// address comes from the gateway's ClusterNetworkAddressConfigProvider (getBindAddress, empty by default), so
// before start-up each gateway's provider is wrapped to answer 127.0.0.1 and everything else as before.
//
// Run with Java's source launcher, the jars of deploy/kroxylicious-pom.xml on the class path:
//   java -cp 'JARS/*' deploy/LoopbackKroxylicious.java CONFIG.yaml

import io.kroxylicious.proxy.KafkaProxy;
import io.kroxylicious.proxy.config.ConfigParser;
import io.kroxylicious.proxy.internal.config.Features;
import io.kroxylicious.proxy.service.ClusterNetworkAddressConfigProvider;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Optional;

public class LoopbackKroxylicious {
  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      throw new IllegalArgumentException("usage: LoopbackKroxylicious CONFIG.yaml");
    }
    ConfigParser parser = new ConfigParser();
    String yaml = Files.readString(Path.of(args[0]));
    try (KafkaProxy proxy = new KafkaProxy(parser, parser.parseConfiguration(yaml), Features.defaultFeatures())) {
      bindLoopback(proxy);
      proxy.startup();
      System.out.println("kroxylicious listening on 127.0.0.1");
      proxy.block();
    }
  }

  private static void bindLoopback(KafkaProxy proxy) throws ReflectiveOperationException {
    for (Object cluster : (List<?>) field(proxy.getClass(), "virtualClusterModels").get(proxy)) {
      for (Object gateway : ((Map<?, ?>) field(cluster.getClass(), "gateways").get(cluster)).values()) {
        Field provider = field(gateway.getClass(), "provider");
        provider.set(gateway, loopback((ClusterNetworkAddressConfigProvider) provider.get(gateway)));
      }
    }
  }

  private static ClusterNetworkAddressConfigProvider loopback(ClusterNetworkAddressConfigProvider inner) {
    return (ClusterNetworkAddressConfigProvider) Proxy.newProxyInstance(
        ClusterNetworkAddressConfigProvider.class.getClassLoader(),
        new Class<?>[] {ClusterNetworkAddressConfigProvider.class},
        (self, method, args) -> {
          if (method.getName().equals("getBindAddress")) {
            return Optional.of("127.0.0.1");
          }
          try {
            return method.invoke(inner, args);
          } catch (InvocationTargetException e) {
            throw e.getCause();
          }
        });
  }

  private static Field field(Class<?> type, String name) throws NoSuchFieldException {
    Field f = type.getDeclaredField(name);
    f.setAccessible(true);
    return f;
  }
}
